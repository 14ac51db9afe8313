"""The server's OpenAPI 3.1 description (``GET /openapi.json``): the endpoints a judge serves, every item format
they accept (clfjudge's own fields, TRL's prompt / chosen / rejected, prompt / completion and messages, a
conversation's content as a string or a list of text parts), the answers and the errors."""
from __future__ import annotations

from typing import Any

TEXT = {"type": "string"}
PART = {"type": "object", "required": ["type", "text"],
        "properties": {"type": {"const": "text"}, "text": TEXT}}
MESSAGE = {"type": "object", "required": ["role", "content"],
           "properties": {"role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
                          "content": {"oneOf": [TEXT, {"type": "array", "items": {"$ref": "#/components/schemas/"
                                                                                           "TextPart"}}]}}}
MESSAGES = {"type": "array", "minItems": 1, "items": {"$ref": "#/components/schemas/Message"}}
PROMPT = {"oneOf": [TEXT, {"$ref": "#/components/schemas/Messages"}],
          "description": "plain text, or a conversation (system prompt and earlier turns are judged too)"}
ANSWER = {"oneOf": [TEXT, {"$ref": "#/components/schemas/Messages"}],
          "description": "plain text, or the assistant's turn as messages"}


SYMMETRIC = {"type": "boolean", "default": False,
             "description": "judge both answer orders and average; on an item posted alone (a batch's items take "
                            "the batch's own symmetric, beside its items)"}


def _obj(required: list[str], **properties: Any) -> dict[str, Any]:
    return {"type": "object", "required": required,
            "properties": {"id": {**TEXT, "description": "returned with the result"}, **properties}}


ITEMS = {
    "compare": {
        "PairItem": _obj(["question", "answer_a", "answer_b"], question=TEXT, answer_a=TEXT, answer_b=TEXT,
                         rubric=TEXT, reference=TEXT, symmetric=SYMMETRIC),
        "PreferenceItem": _obj(["chosen", "rejected"], prompt=PROMPT, chosen=ANSWER, rejected=ANSWER,
                               symmetric=SYMMETRIC),
    },
    "score": {
        "PointItem": _obj(["question", "answer"], question=TEXT, answer=TEXT, rubric=TEXT, reference=TEXT),
        "CompletionItem": _obj(["prompt", "completion"], prompt=PROMPT, completion=ANSWER),
        "ConversationItem": _obj(["messages"], messages={"$ref": "#/components/schemas/Messages",
                                                         "description": "ends with the assistant's answer"}),
    },
}
RESULTS = {
    "compare": {"type": "object", "properties": {
        **{name: {"type": ["number", "null"]} for name in ("p_a", "p_tie", "p_b")},
        "verdict": {"enum": ["A", "B", "TIE", None]}, "margin": {"type": "number"}, "parsed": {"type": "boolean"},
        "generated": {"type": "array", "items": TEXT}}},
    "score": {"type": "object", "properties": {"score": {"type": ["number", "null"]}, "parsed": {"type": "boolean"},
                                               "generated": {"type": "array", "items": TEXT}}},
}


BEARER = "bearer"


def _endpoint(task: str, limits, secured: bool) -> dict[str, Any]:
    item = {"oneOf": [{"$ref": f"#/components/schemas/{name}"} for name in ITEMS[task]]}
    batch = {"type": "object", "required": ["items"],
             "properties": {"items": {"type": "array", "minItems": 1, "maxItems": limits.max_items, "items": item},
                            "symmetric": {"type": "boolean", "default": False,
                                          "description": "judge both answer orders of every item and average"}}}
    result = {"$ref": f"#/components/schemas/{task.capitalize()}Result"}
    error = {"description": "the client's mistake, named (item and field)",
             "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    return {"post": {
        "summary": "compare two answers to a question" if task == "compare" else "score one answer",
        **({"security": [{BEARER: []}]} if secured else {}),
        "requestBody": {"required": True, "content": {"application/json": {"schema": {"oneOf": [item, batch]}}}},
        "responses": {
            "200": {"description": "one result per item (a batch: {\"results\": [...]})",
                    "content": {"application/json": {"schema": {"oneOf": [
                        result, {"type": "object", "properties": {"results": {"type": "array", "items": result}}}]}}}},
            **{code: error for code in ("400", "401", "404", "413", "422")},
            "503": {"description": "queue full or shutting down (Retry-After)"},
            "504": {"description": "waited longer than the server's timeout"},
        }}}


def openapi_schema(judge, tasks, limits, secured: bool = False) -> dict[str, Any]:
    """The OpenAPI document of a server for ``judge`` serving ``tasks``; ``secured``: the server has an API key, so
    /compare, /score and /metrics require ``Authorization: Bearer <key>`` (/healthz and this document do not)."""
    card = getattr(judge, "card", None)
    schemas: dict[str, Any] = {"TextPart": PART, "Message": MESSAGE, "Messages": MESSAGES,
                               "Error": {"type": "object", "required": ["error"], "properties": {"error": TEXT}}}
    paths: dict[str, Any] = {}
    for task in tasks:
        schemas.update(ITEMS[task])
        schemas[f"{task.capitalize()}Result"] = RESULTS[task]
        paths[f"/{task}"] = _endpoint(task, limits, secured)
    paths["/healthz"] = {"get": {"summary": "liveness and what the judge is", "responses": {"200": {
        "description": "status, head, backbone, backend, tasks"}}}}
    paths["/metrics"] = {"get": {"summary": "Prometheus metrics", "responses": {"200": {"description": "text"}}}}
    components: dict[str, Any] = {"schemas": schemas}
    if secured:
        paths["/metrics"]["get"]["security"] = [{BEARER: []}]
        paths["/metrics"]["get"]["responses"]["401"] = {"description": "missing or wrong API key"}
        components["securitySchemes"] = {BEARER: {"type": "http", "scheme": "bearer",
                                                  "description": "the key the server was started with"}}
    title = f"clfjudge {getattr(card, 'head', 'judge')} judge"
    return {"openapi": "3.1.0", "info": {"title": title, "version": str(getattr(card, "schema_version", "1"))},
            "paths": paths, "components": components}
