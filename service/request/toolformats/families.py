"""The model families whose formats come from the registries: each a vLLM parser name, the
family's marker tokens, what its chat template shows, and how it writes calls into a prompt.

The grammar and the parsing are the registries' (``registry.VllmRegistryFormat``); what is written
here is only what no registry says: which texts of a chat template tell the family (vLLM picks a
parser by the operator's flag, never by the template), and how earlier calls look in a prompt
whose template cannot render them (the embedded SmolLM2's: the format is then taught in the
system message, from the same writer).
"""

from __future__ import annotations

from typing import Any

from tokenmold.grammar.json_layout import ARGUMENTS
from tokenmold.grammar.toolformats.written_tags import GRANITE_TOOL_CALL, granite_tag, pythonic_tag
from tokenmold.service.request.toolformats.registry import VllmRegistryFormat

Calls = list[tuple[str, Any]]


def _json(value: Any) -> str:
    """As the grammar lays out arguments (``json_layout.ARGUMENTS``)."""
    return ARGUMENTS.dumps(value)


def _text(value: Any) -> str:
    """An argument value as XML-style formats write it: strings bare, the rest as JSON."""
    return value if isinstance(value, str) else _json(value)


def _items(arguments: Any) -> list[tuple[str, Any]]:
    return list(arguments.items()) if isinstance(arguments, dict) else []


def _qwen_xml(calls: Calls) -> str:
    return "".join(
        f"<tool_call>\n<function={name}>\n"
        + "".join(f"<parameter={key}>\n{_text(value)}\n</parameter>\n" for key, value in _items(arguments))
        + "</function>\n</tool_call>"
        for name, arguments in calls
    )


def _glm(calls: Calls) -> str:
    return "".join(
        f"<tool_call>{name}"
        + "".join(f"<arg_key>{key}</arg_key><arg_value>{_text(value)}</arg_value>" for key, value in _items(arguments))
        + "</tool_call>"
        for name, arguments in calls
    )


def _minimax(calls: Calls) -> str:
    invokes = "".join(
        f'<invoke name="{name}">\n'
        + "".join(f'<parameter name="{key}">{_text(value)}</parameter>\n' for key, value in _items(arguments))
        + "</invoke>\n"
        for name, arguments in calls
    )
    return f"\n<minimax:tool_call>\n{invokes}</minimax:tool_call>"


def _deepseek_v31(calls: Calls) -> str:
    written = "".join(f"<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{_json(a)}<｜tool▁call▁end｜>" for name, a in calls)
    return f"<｜tool▁calls▁begin｜>{written}<｜tool▁calls▁end｜>"


def _deepseek_v3(calls: Calls) -> str:
    written = "\n".join(
        f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{_json(a)}\n```<｜tool▁call▁end｜>"
        for name, a in calls
    )
    return f"<｜tool▁calls▁begin｜>{written}<｜tool▁calls▁end｜>"


def _kimi(calls: Calls) -> str:
    written = "".join(
        f"<|tool_call_begin|>functions.{name}:{i}<|tool_call_argument_begin|>{_json(a)}<|tool_call_end|>"
        for i, (name, a) in enumerate(calls)
    )
    return f"<|tool_calls_section_begin|>{written}<|tool_calls_section_end|>"


def _python(value: Any) -> str:
    """A value as Python writes it where JSON differs (the only differences in JSON's values)."""
    if value is True or value is False or value is None:
        return str(value)
    return _json(value)


def _pythonic(calls: Calls) -> str:
    written = ", ".join(
        f"{name}({', '.join(f'{key}={_python(value)}' for key, value in _items(arguments))})"
        for name, arguments in calls
    )
    return f"[{written}]"


def _envelope(name: str, arguments: Any) -> str:
    """A ``{"name", "arguments"}`` call object as the registries' tags spell it."""
    return f'{{"name": {_json(name)}, "arguments": {_json(arguments)}}}'


def _granite(calls: Calls) -> str:
    return f"{GRANITE_TOOL_CALL}[{', '.join(_envelope(name, arguments) for name, arguments in calls)}]"


def _hermes(calls: Calls) -> str:
    return "".join(f"<tool_call>\n{_envelope(name, arguments)}\n</tool_call>" for name, arguments in calls)


_DEEPSEEK = (
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
)
_KIMI = (
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
)
_GLM = ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")

#: In the order detection tries them: a family whose template shows another's texts too comes
#: before it (DeepSeek V3's template shows V3.1's markers and more; GLM's shows ``<tool_call>``).
REGISTRY_FORMATS: tuple[VllmRegistryFormat, ...] = (
    VllmRegistryFormat(
        name="deepseek_v3",
        markers=_DEEPSEEK,
        detect=("<｜tool▁calls▁begin｜>", "```json"),
        call_open=_DEEPSEEK[2],
        call_close=_DEEPSEEK[3],
        render=_deepseek_v3,
    ),
    VllmRegistryFormat(
        name="deepseek_v31",
        markers=_DEEPSEEK,
        detect=("<｜tool▁calls▁begin｜>",),
        call_open=_DEEPSEEK[2],
        call_close=_DEEPSEEK[3],
        render=_deepseek_v31,
    ),
    VllmRegistryFormat(
        name="kimi_k2", markers=_KIMI, detect=(_KIMI[0],), call_open=_KIMI[2], call_close=_KIMI[4], render=_kimi
    ),
    VllmRegistryFormat(
        name="glm45", markers=_GLM, detect=("<arg_key>",), call_open=_GLM[0], call_close=_GLM[1], render=_glm
    ),
    VllmRegistryFormat(name="glm47", markers=_GLM, call_open=_GLM[0], call_close=_GLM[1], render=_glm),
    VllmRegistryFormat(
        name="minimax_m2",
        markers=("<minimax:tool_call>", "</minimax:tool_call>"),
        detect=("<minimax:tool_call>",),
        call_open="<invoke name=",
        call_close="</invoke>",
        render=_minimax,
    ),
    VllmRegistryFormat(
        name="qwen3_coder",
        detect=("<function=", "<parameter="),
        call_open="<function=",
        call_close="</function>",
        render=_qwen_xml,
    ),
    VllmRegistryFormat(name="qwen3_xml", call_open="<function=", call_close="</function>", render=_qwen_xml),
    VllmRegistryFormat(
        name="granite",
        markers=(GRANITE_TOOL_CALL,),
        detect=(GRANITE_TOOL_CALL,),
        call_open=GRANITE_TOOL_CALL,
        call_close="}]",
        render=_granite,
        build_tag=granite_tag,
    ),
    VllmRegistryFormat(
        name="granite4",
        tag_model="hermes",
        detect=("<|start_of_role|>", "<tool_call>"),
        call_open="<tool_call>",
        call_close="</tool_call>",
        render=_hermes,
    ),
    VllmRegistryFormat(
        name="llama4_pythonic",
        detect=("<|header_start|>", "[func_name1("),
        call_open="[",
        call_close=")]",
        render=_pythonic,
        build_tag=pythonic_tag,
    ),
)
