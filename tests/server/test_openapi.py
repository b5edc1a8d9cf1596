"""``/openapi.json`` and ``/docs``, and a Schemathesis fuzz of that schema against a live server: a bounded
number of generated requests per route (valid and invalid ones), generation kept to 2 tokens. No answer may
be a 5xx or break its declared schema; afterwards the pool invariant holds and a normal request succeeds."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error, response_schema_conformance

ROUTES = {
    "/health",
    "/health_generate",
    "/get_model_info",
    "/get_server_info",
    "/flush_cache",
    "/abort_request",
    "/generate",
    "/v1/models",
    "/v1/models/{model_id}",
    "/v1/chat/completions",
    "/v1/completions",
    "/open_session",
    "/close_session",
    "/dashboard",
    "/cache_tree",
    "/v1/responses",
    "/v1/responses/{response_id}",
    "/v1/responses/{response_id}/input_items",
    "/v1/responses/{response_id}/cancel",
    "/v1/messages",
    "/v1/messages/count_tokens",
}
WITH_INPUT = {
    "/abort_request",
    "/generate",
    "/v1/chat/completions",
    "/v1/completions",
    "/open_session",
    "/close_session",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
}  # invalid inputs exist
EXAMPLES_PER_ROUTE = 12
MAX_TOKENS = 2


@pytest.fixture(autouse=True)
def _idle(request):
    yield
    if "api_server" in request.fixturenames:
        request.getfixturevalue("api_server").wait_idle()


def test_openapi_and_docs_describe_every_route(api_server):
    with api_server.client() as c:
        spec = c.get("/openapi.json").json()
        docs = c.get("/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()
    assert set(spec["paths"]) == ROUTES
    schemas = spec["components"]["schemas"]
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            ok = op["responses"]["200"]["content"]
            assert ok, (path, method)
            if method == "post" and path not in ("/flush_cache", "/v1/responses/{response_id}/cancel"):
                ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
                assert ref.split("/")[-1] in schemas, (path, ref)
    assert {
        "ChatCompletionRequest",
        "CompletionRequest",
        "GenerateRequest",
        "ChatCompletionResponse",
        "CompletionResponse",
        "GenerateOutput",
        "ErrorResponse",
        "SamplingParamsBody",
        "ResponsesRequest",
        "MessagesRequest",
    } <= set(schemas)


def _small(body) -> None:
    """Keep generation to MAX_TOKENS tokens and n <= 2, so each case costs a few steps."""
    if not isinstance(body, dict):
        return
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        if not isinstance(body.get(key), int) or body[key] > MAX_TOKENS:
            body[key] = MAX_TOKENS
    if isinstance(body.get("n"), int) and body["n"] > 2:
        body["n"] = 2
    sps = body.get("sampling_params")
    for sp in sps if isinstance(sps, list) else [sps]:
        if isinstance(sp, dict):
            if not isinstance(sp.get("max_new_tokens"), int) or sp["max_new_tokens"] > MAX_TOKENS:
                sp["max_new_tokens"] = MAX_TOKENS
            if isinstance(sp.get("n"), int) and sp["n"] > 2:
                sp["n"] = 2


def _fuzz_one(api_server, op, mode) -> int:
    """Run EXAMPLES_PER_ROUTE generated cases of ``op``; returns how many ran."""
    ran = []

    @given(case=op.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES_PER_ROUTE,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.generate],
    )
    def run(case):
        if case.path in ("/v1/chat/completions", "/v1/completions", "/generate", "/v1/responses", "/v1/messages"):
            _small(case.body)
        response = case.call(base_url=api_server.url, timeout=120)
        case.validate_response(response, checks=[not_a_server_error, response_schema_conformance])
        ran.append(response.status_code)

    run()
    return len(ran)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
def test_fuzz_schema(api_server, mode):
    schema = schemathesis.openapi.from_url(api_server.url + "/openapi.json")
    seen = set()
    for result in schema.get_all_operations():
        op = result.ok()
        if mode is GenerationMode.NEGATIVE and op.path not in WITH_INPUT:
            continue  # nothing to make invalid
        seen.add(op.path)
        assert _fuzz_one(api_server, op, mode) > 0, op.label
    assert seen == (ROUTES if mode is GenerationMode.POSITIVE else WITH_INPUT)


def test_after_the_fuzz_a_normal_request_succeeds(api_server):
    api_server.wait_idle()
    with api_server.client() as c:
        r = c.post("/v1/completions", json={"prompt": "The capital of France is", "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == " Paris"
