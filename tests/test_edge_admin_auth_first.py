"""Through Envoy, an AddModel without a credential is answered 401 MISSING_TOKEN whatever its body, as the config
service answers it: the edge's body check (request_check.lua) answered an unknown field first, listing the fields a
model config takes, to a caller who had sent no token. With a token the body check answers as before."""

from __future__ import annotations

from edge_helpers import ADMIN_TOKEN, MEAN, curl
from local_cluster import model_config


def test_an_addmodel_without_a_token_is_401_before_its_body_is_judged(edge, tiny_models) -> None:
    config = {**model_config("test/auth-first", tiny_models[MEAN]), "no_such_field": 1}
    status, body = curl(edge, "POST", "/v1/configs/models", config)
    assert status == 401, body
    (info,) = body["details"]
    assert body["code"] == 16 and info["reason"] == "MISSING_TOKEN"
    assert "authorization: Bearer" in body["message"] and "hf_id" not in str(body)
    # Malformed JSON without a token: the same.
    status, body = curl(edge, "POST", "/v1/configs/models", '{"id": "x",}')
    assert status == 401 and body["details"][0]["reason"] == "MISSING_TOKEN", body


def test_with_the_token_the_body_check_answers_as_before(edge, tiny_models) -> None:
    config = {**model_config("test/auth-first", tiny_models[MEAN]), "no_such_field": 1}
    status, body = curl(edge, "POST", "/v1/configs/models", config, {"authorization": f"Bearer {ADMIN_TOKEN}"})
    assert status == 400 and body["details"][0]["reason"] == "UNKNOWN_FIELD", body
    assert "no_such_field" in body["message"]
    # A wrong token: the edge cannot tell it from the right one, so the body's fault comes first there.
    status, body = curl(edge, "POST", "/v1/configs/models", config, {"authorization": "Bearer wrong"})
    assert status == 400 and body["details"][0]["reason"] == "UNKNOWN_FIELD", body
