"""Refusals by the broker's authorizer: which operation on which resource this worker's principal lacks,
said in one line with the ACL that fixes it.

An authorization refusal is a configuration problem, not a transient one: retrying (or aborting and
rewinding a transaction, or logging a consumer error) would loop forever. The worker stops instead, with
nothing committed past what was acknowledged, and a restart after the ACL is granted picks up from there.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AclOperation, AdminClient

from worker.config import KafkaSettings, SecuritySettings, librdkafka_common
from worker.inference.token_budget import StartupError

log = logging.getLogger(__name__)

AUTHORIZATION_CODES = frozenset(
    {
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    }
)
# Operations that imply WRITE's visibility: a principal with ALL may write too.
_WRITES = frozenset({AclOperation.WRITE, AclOperation.ALL})


class AuthorizationError(StartupError):
    """The broker refused this worker's principal an operation. Like a StartupError it means "change the
    configuration" (the CLI exits 2), whenever it shows; the message names the operation and resource."""


def is_authorization_error(error: KafkaError | None) -> bool:
    return error is not None and error.code() in AUTHORIZATION_CODES


def principal_of(security: SecuritySettings) -> str:
    """The principal the broker most likely sees: the SASL user, else the client certificate's holder."""
    if security.sasl_username and (security.security_protocol or "").upper().startswith("SASL"):
        return f"User:{security.sasl_username}"
    if security.ssl_certificate_location is not None and security.uses_tls:
        return f"the principal of {security.ssl_certificate_location.name}"
    return "this worker's principal"


def refusal(
    security: SecuritySettings, operation: str, resource: str, error: KafkaError | str
) -> AuthorizationError:
    """``the broker refused <principal> WRITE on topic 'x' (TOPIC_AUTHORIZATION_FAILED); ...`` + the fix."""
    principal = principal_of(security)
    code = error.name() if isinstance(error, KafkaError) else error
    user = principal if principal.startswith("User:") else "User:<name>"
    return AuthorizationError(
        f"the broker refused {principal} {operation} on {resource} ({code}); grant it as an administrator, "
        f"e.g. `sentiment-worker topics acls --principal {user} --apply` (the ACLs a worker needs). "
        "Nothing was committed past what the broker acknowledged."
    )


def consume_refusal(
    kafka: KafkaSettings, security: SecuritySettings, error: KafkaError
) -> AuthorizationError:
    """A consumer refused the input topic (READ on it) or the group (READ on the group)."""
    if error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
        return refusal(security, "READ", f"group {kafka.group_id!r}", error)
    return refusal(security, "READ", f"topic {kafka.input_topic!r}", error)


def topics_without_write(
    common_conf: dict[str, Any], topics: Sequence[str], timeout_s: float = 10.0
) -> list[str]:
    """The topics of ``topics`` this client may not WRITE to, by the broker's own answer (DescribeTopics
    with the authorized operations). A topic it may not even describe is one it may not write to."""
    admin = AdminClient(dict(common_conf))
    futures = admin.describe_topics(TopicCollection(list(topics)), include_authorized_operations=True)
    missing = []
    for topic in topics:
        try:
            description = futures[topic].result(timeout=timeout_s)
        except KafkaException:
            missing.append(topic)
            continue
        operations = set(description.authorized_operations or ())
        if not operations & _WRITES:
            missing.append(topic)
    return missing


def publish_refusal(
    kafka: KafkaSettings, security: SecuritySettings, error: KafkaError, topics: Sequence[str]
) -> AuthorizationError:
    """What a refused publish (or transaction) lacked: WRITE on a topic, READ on the group (offsets in a
    transaction) or WRITE on the transactional id."""
    code = error.code()
    if code == KafkaError.GROUP_AUTHORIZATION_FAILED:
        return refusal(security, "READ", f"group {kafka.group_id!r}", error)
    if code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
        return refusal(security, "WRITE", "its transactional id", error)
    if code == KafkaError.CLUSTER_AUTHORIZATION_FAILED:
        return refusal(security, "IDEMPOTENT_WRITE (or WRITE on any topic)", "the cluster", error)
    try:
        denied = topics_without_write(librdkafka_common(kafka, security), list(dict.fromkeys(topics)))
    except Exception as exc:  # noqa: BLE001 - the refusal is what matters; the probe only sharpens it
        log.debug("cannot tell which topic refused the write: %s", exc)
        denied = []
    names = ", ".join(repr(t) for t in denied or topics)
    return refusal(security, "WRITE", f"topic {names}", error)
