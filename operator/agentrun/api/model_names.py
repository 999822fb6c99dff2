"""The Claude model a provider's model ID names, so one price and context-window table serves all three.

Bedrock names a model ``anthropic.claude-sonnet-4-5-20250929-v1:0``, a cross-region inference
profile prefixes a geography (``us.``, ``eu.``, ``global.``), an ARN wraps either; Vertex AI writes
the date after an ``@`` (``claude-sonnet-4-5@20250929``). Each is read back to the name Anthropic's
API uses (``claude-sonnet-4-5-20250929``), which the built-in tables match by prefix. An ID that names
no Claude model this way (an application inference profile's ARN) is left as it is: an operator's
price entry naming it exactly prices it.
"""

from __future__ import annotations

import re

_ARN = re.compile(r"^arn:aws[-a-z]*:bedrock:[^:]*:[^:]*:(?:foundation-model|inference-profile)/(?P<id>.+)$")
_GEOGRAPHY = re.compile(r"^(?:[a-z]{2,6}(?:-gov)?\.)(?=anthropic\.)")
_BEDROCK = re.compile(r"^anthropic\.(?P<name>claude-[-a-z0-9.]+?)(?:-v\d+(?::\d+)?)?$")
_VERTEX = re.compile(r"^(?P<name>claude-[-a-z0-9.]+)@(?P<date>\d{8}|latest)$")


def claude_model(model_id: str) -> str:
    """The Anthropic API name of a Bedrock or Vertex AI model ID; any other ID unchanged."""
    arn = _ARN.match(model_id)
    name = arn.group("id") if arn else model_id
    name = _GEOGRAPHY.sub("", name)
    bedrock = _BEDROCK.match(name)
    if bedrock:
        return bedrock.group("name")
    vertex = _VERTEX.match(name)
    if vertex:
        date = vertex.group("date")
        return vertex.group("name") if date == "latest" else f"{vertex.group('name')}-{date}"
    return model_id
