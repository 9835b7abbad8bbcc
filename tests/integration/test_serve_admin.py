"""`serve` without a broker takes model changes on its admin route (model_control=api, the API token), over
real HTTP with real models (the tiny session model as the primary, its INT8 form as the shadow or the next
primary): 401 without the token as the API answers it, 403 with no token configured, 422 for a bad body, 409
for a directory failing verification (nothing changes), 200 and the new model serving after a change."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.serve_helpers import serving
from tests.polling import wait_until
from worker.config import WorkerSettings
from worker.model.manifest import model_content_hash
from worker.runtime.root import models_for

pytestmark = pytest.mark.integration

ADMIN = "/v1/admin/models"
API = "/v1/sentiment"
SECRET = "s3cret-admin-token"
AUTH = {"Authorization": f"Bearer {SECRET}"}
TEXTS = ["外卖送得很快，饭菜还是热的", "等了两个小时，菜都凉了", "味道不错，下次还来", "太难吃了"]


def settings_for(model: Path, **extra: Any) -> dict[str, Any]:
    return {"model": str(model), "device": "cpu", "cpu_threads": 1, "http_port": 0, **extra}


def built(values: dict[str, Any]) -> Any:
    labeller, control = models_for(WorkerSettings(**values).sections, "serve")
    assert control is not None
    return labeller, control


def test_the_admin_route_changes_the_served_models_behind_the_token(
    tiny_model_dir: Path, tiny_int8_dir: Path, tmp_path: Path
) -> None:
    values = settings_for(tiny_model_dir, api_token=SECRET)
    broken = tmp_path / "broken"
    shutil.copytree(tiny_int8_dir, broken)
    with (broken / "config.json").open("a") as config:
        config.write(" ")
    with serving(None, models=built(values), **values) as served:
        url = served.url + ADMIN
        for headers in ({}, {"Authorization": "Bearer nope"}):
            for method in ("GET", "PUT"):
                refused = httpx.request(method, url, headers=headers, json={"shadow": str(tiny_int8_dir)})
                assert refused.status_code == 401 and refused.json()["error"] == "unauthorized"
                assert refused.headers["WWW-Authenticate"].startswith("Bearer")
        state = httpx.get(url, headers=AUTH).json()
        assert state["desired"] is None
        assert state["replica"]["primary"]["content_hash"] == model_content_hash(tiny_model_dir)
        assert state["replica"]["shadow"] is None
        for body in (b"not json", b"[]", b'{"primary": 5}', b'{"model": "x"}', b'{"shadow": ""}'):
            bad = httpx.put(url, headers={**AUTH, "Content-Type": "application/json"}, content=body)
            assert (bad.status_code, bad.json()["error"]) == (422, "invalid_request"), body
        refused = httpx.put(url, headers=AUTH, json={"shadow": str(broken)}, timeout=120)
        assert refused.status_code == 409 and refused.json()["error"] == "model_refused"
        assert "config.json does not match" in refused.json()["reason"]
        missing = httpx.put(url, headers=AUTH, json={"primary": str(tmp_path / "none")}, timeout=120)
        assert missing.status_code == 409 and "does not exist" in missing.json()["reason"]
        assert httpx.get(url, headers=AUTH).json()["replica"]["shadow"] is None  # nothing changed

        shadowed = httpx.put(url, headers=AUTH, json={"shadow": str(tiny_int8_dir)}, timeout=120)
        assert shadowed.status_code == 200, shadowed.text
        shadow = shadowed.json()["replica"]["shadow"]
        assert shadow["content_hash"] == model_content_hash(tiny_int8_dir)
        assert shadowed.json()["desired"]["primary"] is None  # the started-with primary kept
        answer = httpx.post(served.url + API, headers=AUTH, json={"texts": TEXTS}, timeout=60)
        primary_version = answer.json()["model"]["version"]
        assert answer.status_code == 200 and primary_version != shadow["version"]  # only the primary answers
        wait_until(
            lambda: (httpx.get(url, headers=AUTH).json()["replica"]["agreement"] or {}).get("reviews") == 4,
            60,
            "the shadow to label the 4 texts",
        )

        promoted = httpx.put(
            url, headers=AUTH, json={"primary": str(tiny_int8_dir), "shadow": None}, timeout=120
        )
        assert promoted.status_code == 200, promoted.text
        replica = promoted.json()["replica"]
        assert replica["shadow"] is None
        assert replica["primary"]["content_hash"] == model_content_hash(tiny_int8_dir)
        answer = httpx.post(served.url + API, headers=AUTH, json={"texts": TEXTS}, timeout=60)
        assert answer.status_code == 200
        assert answer.json()["model"]["version"] == replica["primary"]["version"]


def test_without_an_api_token_the_admin_route_is_forbidden(tiny_model_dir: Path, tiny_int8_dir: Path) -> None:
    values = settings_for(tiny_model_dir, model_control="api")
    with serving(None, models=built(values), **values) as served:
        for method in ("GET", "PUT"):
            refused = httpx.request(method, served.url + ADMIN, json={"shadow": str(tiny_int8_dir)})
            assert (refused.status_code, refused.json()["error"]) == (403, "forbidden")
            assert "SENTIMENT_API_TOKEN" in refused.json()["reason"]
