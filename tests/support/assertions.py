"""What every API error must look like: {"error": {"code", "message", "fields"}}."""

import json


def assert_error(response, status: int, code: str, *, field=None, says=()) -> dict:
    """Check the status, the error body's code, that `fields` names `field` (a name or a
    list of names), and that the message contains each of `says` (case-insensitive).
    Returns the `error` object for further checks."""
    assert response.status_code == status, (response.status_code, _body(response))
    body = _body(response)
    assert set(body) == {"error"}, body
    error = body["error"]
    assert {"code", "message", "fields"} <= set(error), error
    assert error["code"] == code, error
    assert isinstance(error["message"], str) and error["message"].strip(), error
    assert isinstance(error["fields"], dict), error
    for name in [field] if isinstance(field, str) else field or []:
        assert name in error["fields"], (name, error)
        assert str(error["fields"][name]).strip(), error
    for text in [says] if isinstance(says, str) else says:
        assert text.lower() in error["message"].lower(), (text, error["message"])
    return error


def _body(response) -> dict:
    return json.loads(response.content)
