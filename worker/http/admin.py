"""The admin route of `serve` without a broker (model_control=api): the same model changes the control topic
carries, on the HTTP port, behind the API's bearer token.

    GET /v1/admin/models   what this replica serves (primary, shadow, the shadow's agreement), the desired
                           state it follows and its problem
    PUT /v1/admin/models   {"primary"?: DIR | null, "shadow"?: DIR | null}: a key left out keeps what is
                           served; null is the started-with model (primary) or no shadow

`ApiGuard` checks the token for every path under /v1/ (401, as for the API); without a token configured the
route answers 403 (it is never open). A body that is not such a JSON object is 422. A directory that fails
verification (worker.model.manifest), or that the replica refuses to serve (labels, probe), is 409 with the
reason; what was served stays served.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from schemas.control import DesiredState, ModelChoice, ModelsChange
from worker.labelling.control import ModelControl, model_choice
from worker.model.manifest import UnverifiedModelError

__all__ = ["ADMIN_MODELS_PATH", "ModelsAdmin"]

ADMIN_MODELS_PATH = "/v1/admin/models"
_MAX_BODY_BYTES = 64 * 1024


class ModelsAdmin:
    """The admin route's logic over a replica's `ModelControl`: one change at a time (a lock), each checked
    here before the control loads anything."""

    def __init__(self, control: ModelControl, *, token_set: bool) -> None:
        self._control = control
        self._token_set = token_set
        self._changing = threading.Lock()

    def add_routes(self, app: FastAPI) -> None:
        """Adds GET and PUT /v1/admin/models to `app` (kept out of the OpenAPI document)."""

        @app.get(ADMIN_MODELS_PATH, include_in_schema=False)
        async def models_status() -> Response:
            return self._forbidden() or JSONResponse(self.state())

        @app.put(ADMIN_MODELS_PATH, include_in_schema=False)
        async def models_change(request: Request) -> Response:
            forbidden = self._forbidden()
            if forbidden is not None:
                return forbidden
            body = await request.body()
            if len(body) > _MAX_BODY_BYTES:
                return _error(413, "body_too_large", f"the body is larger than {_MAX_BODY_BYTES} bytes")
            try:
                data = json.loads(body)
                change = ModelsChange.model_validate(data)
            except (ValueError, ValidationError) as exc:
                reason = (
                    "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors())
                    if isinstance(exc, ValidationError)
                    else f"not JSON ({exc})"
                )
                return _error(422, "invalid_request", f'send {{"primary"?: DIR, "shadow"?: DIR}}: {reason}')
            # Loading and probing a model takes seconds: off the event loop. The keys sent say what changes.
            status, answer = await asyncio.to_thread(self.change, change, set(data))
            return JSONResponse(answer, status)

    def state(self) -> dict[str, object]:
        """What GET answers: the desired state followed (None: as started) and this replica's status."""
        desired = self._control.desired
        return {
            "desired": desired.model_dump(mode="json") if desired is not None else None,
            "replica": self._control.status().model_dump(mode="json"),
        }

    def change(self, change: ModelsChange, given: set[str]) -> tuple[int, dict[str, object]]:
        """Applies `change` (only the keys in `given`): (200, the new state) or (409, the refusal)."""
        with self._changing:
            current = self._control.desired
            try:
                primary = (
                    _choice(change.primary)
                    if "primary" in given
                    else (current.primary if current is not None else None)
                )
                shadow = (
                    _choice(change.shadow)
                    if "shadow" in given
                    else (current.shadow if current is not None else None)
                )
            except UnverifiedModelError as exc:
                return 409, {"error": "model_refused", "reason": str(exc)}
            desired = DesiredState(
                primary=primary,
                shadow=shadow,
                changed_at_ms=int(time.time() * 1000),
                changed_by=f"PUT {ADMIN_MODELS_PATH}",
            )
            self._control.apply(desired)
            if self._control.problem is not None:
                return 409, {"error": "model_refused", "reason": self._control.problem, **self.state()}
            return 200, self.state()

    def _forbidden(self) -> Response | None:
        if self._token_set:
            return None
        return _error(403, "forbidden", "the admin route needs an API token: set SENTIMENT_API_TOKEN")


def _choice(path: str | None) -> ModelChoice | None:
    """`path` as a control record names it, verified first (UnverifiedModelError says why not)."""
    return None if path is None else model_choice(Path(path))


def _error(status: int, error: str, reason: str) -> JSONResponse:
    return JSONResponse({"error": error, "reason": reason}, status)
