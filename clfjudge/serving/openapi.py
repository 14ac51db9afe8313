"""The server's OpenAPI 3.1 description (``GET /openapi.json``): the endpoints a judge serves, every item format
they accept (clfjudge's own fields, TRL's prompt / chosen / rejected, prompt / completion and messages, a
conversation's content as a string or a list of text parts), the answers and the errors.

It is the contract the server keeps, and the server checks its items by it (``ITEMS``): every object is closed
(``additionalProperties: false``) and names what it requires, so each body, item and answer matches exactly one
schema of a ``oneOf``; a field the document does not declare is refused (422), whatever the item's format."""
from __future__ import annotations

from typing import Any

TEXT = {"type": "string"}
OPTIONAL_TEXT = {"type": ["string", "null"], "description": "null: as if absent"}
NULLABLE_NUMBER = {"type": ["number", "null"]}
ID = {"type": ["string", "integer"], "description": "the item's own id, returned in its result"}
PART = {"type": "object", "required": ["type", "text"], "additionalProperties": False,
        "properties": {"type": {"const": "text"}, "text": TEXT}}
MESSAGE = {"type": "object", "required": ["role", "content"], "additionalProperties": False,
           "properties": {"role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
                          "content": {"oneOf": [TEXT, {"type": "array", "items": {"$ref": "#/components/schemas/"
                                                                                           "TextPart"}}]}}}
MESSAGES = {"type": "array", "minItems": 1, "items": {"$ref": "#/components/schemas/Message"}}
PROMPT = {"oneOf": [TEXT, {"$ref": "#/components/schemas/Messages"}],
          "description": "plain text, or a conversation (system prompt and earlier turns are judged too)"}
ANSWER = {"oneOf": [TEXT, {"$ref": "#/components/schemas/Messages"}],
          "description": "plain text, or the assistant's turn as messages (with the conversation before it when there "
                         "is no prompt); text beside a text prompt, messages beside a conversation"}
QUESTION = {"type": "string", "pattern": "\\S", "description": "not blank"}
SYMMETRIC = {"type": "boolean", "default": False, "description": "judge both answer orders and average"}


def _obj(required: list[str], **properties: Any) -> dict[str, Any]:
    return {"type": "object", "required": required, "additionalProperties": False,
            "properties": {"id": ID, **properties}}


# Each task's item formats, by schema name: the first is clfjudge's own (``server.validate`` reads it), the others
# another format of the ecosystem (``data.formats`` reads them). An item in a batch; posted alone, a /compare item
# may also carry ``symmetric`` (``request``).
ITEMS = {
    "compare": {
        "PairItem": _obj(["question", "answer_a", "answer_b"], question=QUESTION, answer_a=TEXT, answer_b=TEXT,
                         rubric=OPTIONAL_TEXT, reference=OPTIONAL_TEXT),
        "PreferenceItem": _obj(["chosen", "rejected"], prompt={"oneOf": [*PROMPT["oneOf"], {"type": "null"}],
                                                               "description": PROMPT["description"]},
                               chosen=ANSWER, rejected=ANSWER),
    },
    "score": {
        "PointItem": _obj(["question", "answer"], question=QUESTION, answer=TEXT, rubric=OPTIONAL_TEXT,
                          reference=OPTIONAL_TEXT),
        "CompletionItem": _obj(["prompt", "completion"], prompt=PROMPT, completion=ANSWER),
        "ConversationItem": _obj(["messages"], messages={"$ref": "#/components/schemas/Messages",
                                                         "description": "ends with the assistant's answer"}),
    },
}
# What a request may carry beside its item(s): ``symmetric`` only where the judge compares.
OPTIONS = {"compare": {"symmetric": SYMMETRIC}, "score": {}}
GENERATED = {"parsed": {"type": "boolean", "description": "a generative judge: whether its output was read"},
             "generated": {"type": "array", "items": TEXT, "description": "a generative judge's output(s)"}}
RESULTS = {
    "compare": {"type": "object", "required": ["p_a", "p_tie", "p_b", "verdict"], "additionalProperties": False,
                "properties": {"id": ID, **{name: NULLABLE_NUMBER for name in ("p_a", "p_tie", "p_b")},
                               "verdict": {"enum": ["A", "B", "TIE", None]},
                               "margin": {"type": "number", "description": "a reward head: r(a) - r(b)"},
                               **GENERATED}},
    "score": {"type": "object", "required": ["score"], "additionalProperties": False,
              "properties": {"id": ID, "score": NULLABLE_NUMBER, **GENERATED}},
}
ERROR = {"type": "object", "required": ["error"], "additionalProperties": False, "properties": {"error": TEXT}}
HEALTH = {"type": "object", "required": ["status", "kind", "head", "backbone", "backend", "tasks"],
          "additionalProperties": False,
          "properties": {"status": {"enum": ["ok", "draining"]}, "kind": TEXT, "head": TEXT, "backbone": TEXT,
                         "backend": TEXT, "tasks": {"type": "array", "items": {"enum": ["compare", "score"]}}}}
ERRORS = {
    "400": "the body is not UTF-8, not JSON, or nested too deep",
    "408": "the body did not arrive within the read timeout",
    "413": "a body, item count or text over its limit",
    "422": "an item: a field missing, of the wrong type or unknown; an empty question; text that is not Unicode",
    "500": "an unexpected server error (the server's fault)",
    "503": "the judge failed on this call, the queue is full or the server is shutting down (Retry-After)",
    "504": "waited longer than the server's timeout",
}
BEARER = "bearer"


def request(task: str, name: str) -> dict[str, Any]:
    """The schema of one ``name`` item posted alone: the item and the request's options."""
    item = ITEMS[task][name]
    return {**item, "properties": {**item["properties"], **OPTIONS[task]}}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _schemas(task: str, limits) -> dict[str, Any]:
    """The components of one task: its items, each posted alone, the batch, the result and the results."""
    title = task.capitalize()
    schemas: dict[str, Any] = dict(ITEMS[task])
    if OPTIONS[task]:
        schemas.update({f"{name.removesuffix('Item')}Request": request(task, name) for name in ITEMS[task]})
    schemas[f"{title}Batch"] = {
        "type": "object", "required": ["items"], "additionalProperties": False,
        "properties": {"items": {"type": "array", "minItems": 1, "maxItems": limits.max_items,
                                 "items": {"oneOf": [_ref(name) for name in ITEMS[task]]}}, **OPTIONS[task]}}
    schemas[f"{title}Result"] = RESULTS[task]
    schemas[f"{title}Results"] = {"type": "object", "required": ["results"], "additionalProperties": False,
                                  "properties": {"results": {"type": "array", "items": _ref(f"{title}Result")}}}
    return schemas


def _endpoint(task: str, secured: bool) -> dict[str, Any]:
    title = task.capitalize()
    alone = [f"{name.removesuffix('Item')}Request" if OPTIONS[task] else name for name in ITEMS[task]]
    body = {"oneOf": [_ref(name) for name in alone] + [_ref(f"{title}Batch")]}
    error = _ref("Error")
    codes = {code: _json(error, why) for code, why in ERRORS.items()}
    if secured:
        codes["401"] = _json(error, "missing or wrong API key")
    return {"post": {
        "summary": "compare two answers to a question" if task == "compare" else "score one answer",
        **({"security": [{BEARER: []}]} if secured else {}),
        "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
        "responses": {"200": _json({"oneOf": [_ref(f"{title}Result"), _ref(f"{title}Results")]},
                                   "an item's result; a batch's: {\"results\": [...]}, one per item in order"),
                      **dict(sorted(codes.items()))}}}


def openapi_schema(judge, tasks, limits, secured: bool = False) -> dict[str, Any]:
    """The OpenAPI document of a server for ``judge`` serving ``tasks``; ``secured``: the server has an API key, so
    /compare, /score and /metrics require ``Authorization: Bearer <key>`` (/healthz and this document do not)."""
    card = getattr(judge, "card", None)
    schemas: dict[str, Any] = {"TextPart": PART, "Message": MESSAGE, "Messages": MESSAGES, "Error": ERROR,
                               "Health": HEALTH}
    paths: dict[str, Any] = {}
    for task in tasks:
        schemas.update(_schemas(task, limits))
        paths[f"/{task}"] = _endpoint(task, secured)
    paths["/healthz"] = {"get": {"summary": "liveness and what the judge is",
                                 "responses": {"200": _json(_ref("Health"), "status, head, backbone, backend, "
                                                                            "tasks")}}}
    paths["/metrics"] = {"get": {"summary": "Prometheus metrics", "responses": {"200": {
        "description": "Prometheus text format", "content": {"text/plain": {"schema": TEXT}}}}}}
    paths["/openapi.json"] = {"get": {"summary": "this document",
                                      "responses": {"200": _json({"type": "object"}, "OpenAPI 3.1")}}}
    components: dict[str, Any] = {"schemas": schemas}
    if secured:
        paths["/metrics"]["get"]["security"] = [{BEARER: []}]
        paths["/metrics"]["get"]["responses"]["401"] = _json(_ref("Error"), "missing or wrong API key")
        components["securitySchemes"] = {BEARER: {"type": "http", "scheme": "bearer",
                                                  "description": "the key the server was started with"}}
    title = f"clfjudge {getattr(card, 'name', 'judge')} judge"
    return {"openapi": "3.1.0", "info": {"title": title, "version": str(getattr(card, "schema_version", "1"))},
            "paths": paths, "components": components}
