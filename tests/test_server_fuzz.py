"""Schema-based fuzzing of the API (schemathesis against the app's own OpenAPI document, fake engine):
whatever the generated body, positive or negative, no answer is a 5xx. Bounded: a few dozen examples per
operation, no deadline (the 2-core test machine is shared)."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
from fakes import FakeEmbedder, FakeEngine  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402

from app.server import create_app  # noqa: E402
from app.server.models import ModelCatalog  # noqa: E402

_engine = FakeEngine(n_ctx=512)
_catalog = ModelCatalog(lambda: [("fake-model", "fake-model.gguf", "chat"),
                                  ("other-model", "other-model.gguf", "chat")])
_app = create_app(_engine, embedder=FakeEmbedder("fake-embed@000000000000"), allow_hosts=["testserver", "localhost"],
                  catalog=_catalog)
schema = schemathesis.openapi.from_asgi("/openapi.json", _app)


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case):
    case.call_and_validate(checks=[not_a_server_error])
