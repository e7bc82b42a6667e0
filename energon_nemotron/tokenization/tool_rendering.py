"""Tool definitions, tool calls and tool results as the Nemotron chat templates render them.

Pure string functions used by the ``nemotron6`` and ``nemotron-h`` prompt formats
(``tokenization.formats``). They follow the published Hugging Face chat templates of the models:

- Nemotron 3 (``nemotron6``): tools as an XML block appended to the system message (``# Tools`` …
  ``<tools><function><name>…``), each call as ``<tool_call>\\n<function=NAME>\\n<parameter=ARG>\\n
  VALUE\\n</parameter>\\n</function>\\n</tool_call>\\n``, consecutive tool results in one user turn,
  each as ``<tool_response>\\n{result}\\n</tool_response>\\n``.
- Nemotron-H / Nano v2 (``nemotron-h``): tools as JSON in ``<AVAILABLE_TOOLS>[…]</AVAILABLE_TOOLS>``
  after the system text, the calls of a turn as ``<TOOLCALL>[{"name": …, "arguments": …}, …]</TOOLCALL>``,
  consecutive tool results as ``<TOOL_RESPONSE>[r1, r2]</TOOL_RESPONSE>``.

Values follow the templates' Jinja filters as Hugging Face runs them: ``tojson`` is
``json.dumps(value, ensure_ascii=False)``; ``string`` is ``str(value)``; ``trim`` is ``str.strip``.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Sequence

from energon_nemotron.types import ToolCall


def tojson(value: Any) -> str:
    """Jinja's ``tojson`` as Hugging Face's chat-template environment defines it."""
    return json.dumps(value, ensure_ascii=False)


def _structured(value: Any) -> bool:
    """A mapping or a non-string sequence (rendered with ``tojson``; anything else with ``str``)."""
    return isinstance(value, (dict, list, tuple))


def _value(value: Any) -> str:
    return tojson(value) if _structured(value) else str(value)


def function_of(tool: dict) -> dict:
    """The function definition of an OpenAI tool (``{"type": "function", "function": {...}}``) or a
    bare function definition."""
    inner = tool.get("function")
    return inner if isinstance(inner, dict) else tool


# -- Nemotron 3 ----------------------------------------------------------------------------------
#: the instructions the Nemotron 3 template puts after the ``<tools>`` block (model-facing text)
NEMOTRON6_TOOL_INSTRUCTIONS = (
    "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> block must be "
    "nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the function "
    "call, but NOT after\n"
    "- If there is no function call available, answer the question like normal with your current knowledge "
    "and do not tell the user about function calls\n</IMPORTANT>")


def _extra_keys(obj: Any, handled: Iterable[str]) -> str:
    """Keys of a mapping not otherwise rendered, each as ``\\n<key>value</key>``."""
    if not isinstance(obj, dict):
        return ""
    return "".join(f"\n<{k}>{_value(v)}</{k}>" for k, v in obj.items() if k not in handled)


def nemotron6_tools(tools: Sequence[dict]) -> str:
    """The ``# Tools`` block of the Nemotron 3 system message (without the separating blank line)."""
    out = ["# Tools\n\nYou have access to the following functions:\n\n<tools>"]
    for tool in tools:
        fn = function_of(tool)
        out.append(f"\n<function>\n<name>{fn.get('name')}</name>")
        if "description" in fn:
            out.append(f"\n<description>{str(fn['description']).strip()}</description>")
        out.append("\n<parameters>")
        params = fn.get("parameters")
        props = params.get("properties") if isinstance(params, dict) else None
        if isinstance(props, dict):
            for name, spec in props.items():
                out.append(f"\n<parameter>\n<name>{name}</name>")
                if isinstance(spec, dict):
                    if "type" in spec:
                        out.append(f"\n<type>{spec['type']}</type>")
                    if "description" in spec:
                        out.append(f"\n<description>{str(spec['description']).strip()}</description>")
                    if "enum" in spec:
                        out.append(f"\n<enum>{tojson(spec['enum'])}</enum>")
                out.append(_extra_keys(spec, ("name", "type", "description", "enum")))
                out.append("\n</parameter>")
        out.append(_extra_keys(params, ("type", "properties", "required")))
        if isinstance(params, dict) and "required" in params:
            out.append(f"\n<required>{tojson(params['required'])}</required>")
        out.append("\n</parameters>")
        out.append(_extra_keys(fn, ("type", "name", "description", "parameters")))
        out.append("\n</function>")
    out.append("\n</tools>")
    out.append(NEMOTRON6_TOOL_INSTRUCTIONS)
    return "".join(out)


def nemotron6_call(call: ToolCall) -> str:
    """One call: ``<tool_call>\\n<function=NAME>\\n`` + per argument ``<parameter=K>\\nV\\n</parameter>\\n``
    + ``</function>\\n</tool_call>\\n``."""
    args = "".join(f"<parameter={k}>\n{_value(v)}\n</parameter>\n" for k, v in call.arguments.items())
    return f"<tool_call>\n<function={call.name}>\n{args}</function>\n</tool_call>\n"


def nemotron6_tool_result(text: str) -> str:
    return f"<tool_response>\n{text}\n</tool_response>\n"


# -- Nemotron-H / Nano v2 --------------------------------------------------------------------------
#: the Nano v2 template's tool instructions after ``<AVAILABLE_TOOLS>`` (model-facing text; the
#: doubled braces are in the rendered text)
NEMOTRON_H_TOOL_INSTRUCTIONS = (
    "If you decide to call any tool(s), use the following format:\n"
    '<TOOLCALL>[{{"name": "tool_name1", "arguments": "tool_args1"}}, '
    '{{"name": "tool_name2", "arguments": "tool_args2"}}]</TOOLCALL>\n\n'
    "The user will execute tool-calls and return responses from tool(s) in this format:\n"
    '<TOOL_RESPONSE>[{{"tool_response1"}}, {{"tool_response2"}}]</TOOL_RESPONSE>\n\n'
    "Based on the tool responses, you can call additional tools if needed, correct tool calls if any "
    "errors are found, or just respond to the user.")


def nemotron_h_tools(tools: Sequence[dict]) -> str:
    """The tool text of the Nano v2 system turn (without the separating blank line)."""
    listed = ", ".join(tojson(function_of(t)) for t in tools)
    return ("You can use the following tools to assist the user if required:\n"
            f"<AVAILABLE_TOOLS>[{listed}]</AVAILABLE_TOOLS>\n\n{NEMOTRON_H_TOOL_INSTRUCTIONS}")


def nemotron_h_calls(calls: Sequence[ToolCall]) -> str:
    """``<TOOLCALL>[{"name": "N", "arguments": A}, ...]</TOOLCALL>``; ``A`` is the call's JSON string
    as the data held it, else ``tojson`` of the arguments."""
    items = ", ".join(f'{{"name": "{c.name}", "arguments": {c.raw if c.raw is not None else tojson(c.arguments)}}}'
                      for c in calls)
    return f"<TOOLCALL>[{items}]</TOOLCALL>"


def tool_texts(calls: Sequence[ToolCall]) -> list[tuple[str, str]]:
    """Every string a tool call carries, as (field, text): the name, the id and each string inside
    the arguments (for the reserved-tag check)."""
    out: list[tuple[str, str]] = []
    for k, c in enumerate(calls):
        out.append((f"tool_calls[{k}].name", c.name))
        if c.id is not None:
            out.append((f"tool_calls[{k}].id", c.id))
        out.extend((f"tool_calls[{k}].arguments{path}", s) for path, s in strings_in(c.arguments))
    return out


def strings_in(value: Any, path: str = "") -> list[tuple[str, str]]:
    """Every string (keys included) inside a JSON value, as (path, string)."""
    if isinstance(value, str):
        return [(path, value)]
    if isinstance(value, dict):
        out = []
        for k, v in value.items():
            out.append((f"{path}.{k}", str(k)))
            out.extend(strings_in(v, f"{path}.{k}"))
        return out
    if isinstance(value, (list, tuple)):
        return [item for i, v in enumerate(value) for item in strings_in(v, f"{path}[{i}]")]
    return []
