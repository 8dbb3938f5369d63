"""xgrammar: the first-choice backend, and the one vLLM applies in its model runner.

A compiled grammar is handed to vLLM as EBNF text (``EngineSpec(kind="grammar")``), which vLLM's
xgrammar backend compiles into the bitmask it applies to the raw logits before every other
processor. Going through EBNF rather than vLLM's own JSON path keeps tokenmold's choices
(normalized schema, non-strict properties, bounded whitespace) instead of vLLM's fixed ones.

Tool calls are built as an xgrammar structural tag whose contents are our own JSON grammars (one per
function, each with its own strictness); the structural tag supplies what plain EBNF cannot say:
free text that switches to a constrained call when the model writes ``<tool_call>`` (xgrammar's
``TagDispatch``). The result still prints as EBNF, so vLLM receives it like any other grammar.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import xgrammar as xgr

from tokenmold.grammar.backends.base import Backend, CompiledGrammar, EngineSpec, JsonOptions, Matcher
from tokenmold.grammar.errors import CompileFailed, GrammarSyntaxError, RegexError, SchemaError
from tokenmold.grammar.json_layout import ARGUMENTS, COMPACT, JsonLayout
from tokenmold.grammar.jsonschema.fold import fold_llguidance_only
from tokenmold.grammar.toolformats.registry import RegistryFormat

if TYPE_CHECKING:
    import torch

    from tokenmold.grammar.tools import ToolCalls

_LOG_PREFIX = re.compile(r"^\[[\d:]+\] \S+?:\d+: ")
_LINE_COL = re.compile(r"at line (\d+), column (\d+)")
_POSITION = re.compile(r"at position (\d+)")
#: A rule as xgrammar prints a parsed grammar whose body is one rule reference, alone or repeated
#: (``x ::= ((y))``, ``x ::= ((y{2, 3}))``; ``-1``: no upper bound).
_LONE_REFERENCE = re.compile(r"^(\S+) ::= \(\((\S+?)(\{-?\d+, -?\d+\})?\)\)$")


def _clean(exc: Exception) -> str:
    """xgrammar's C++ message without its log prefix."""
    return _LOG_PREFIX.sub("", str(exc)).strip()


def _first_line(exc: Exception) -> str:
    """The first line of xgrammar's message (pydantic's are long tables)."""
    lines = _clean(exc).splitlines()
    return " ".join(lines[:3]) if lines else type(exc).__name__


def _undecodable(text: str) -> str:
    """The message for xgrammar errors whose own text cannot be decoded: xgrammar 0.2.8 cuts its
    message inside a multi-byte character and the binding raises UnicodeDecodeError (found by
    fuzz/fuzz_ebnf.py). Point at the first non-ASCII character, where it happens."""
    for line_no, line in enumerate(text.splitlines() or [text], start=1):
        for col, ch in enumerate(line, start=1):
            if ord(ch) > 127:
                return f"parse error at or after line {line_no}, column {col} (near {ch!r})"
    return "parse error (xgrammar's message was not valid UTF-8)"


class XGrammarMatcher(Matcher):
    def __init__(self, compiled: xgr.CompiledGrammar) -> None:
        self._matcher = xgr.GrammarMatcher(compiled)

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int = 0) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, index)

    def accept_token(self, token_id: int) -> bool:
        if self.error is not None:
            return False
        if not self._matcher.accept_token(token_id):
            self.error = f"token {token_id} is not allowed here"
            return False
        return True

    def accept_text(self, text: str) -> bool:
        if self.error is not None:
            return False
        if not self._matcher.accept_string(text):
            self.error = "text does not match the grammar"
            return False
        return True

    def is_accepting(self) -> bool:
        return self.error is None and self._matcher.is_completed()

    def jump_forward_string(self) -> str:
        """The text the grammar forces next (possibly empty)."""
        forced: str = self._matcher.find_jump_forward_string()
        return forced


class XGrammarCompiled(CompiledGrammar):
    backend = "xgrammar"

    def __init__(self, compiled: xgr.CompiledGrammar, source: xgr.Grammar) -> None:
        self.compiled = compiled
        #: The grammar as parsed, before compiling: what the engine is given. The compiled one's
        #: print (``compiled.grammar``: rules inlined, strings merged) compiles again into far more
        #: states: the grammar-store bench's open object took the engine several times as long to
        #: compile and serialized far larger (``python -m benchmarks grammar_store``).
        self.source = source

    def matcher(self) -> XGrammarMatcher:
        return XGrammarMatcher(self.compiled)

    @property
    def memory_bytes(self) -> int:
        return int(self.compiled.memory_size_bytes)

    @property
    def engine_spec(self) -> EngineSpec:
        return EngineSpec(kind="grammar", text=str(self.source), backend=self.backend)


class XGrammarBackend(Backend):
    name = "xgrammar"

    def __init__(self, vocab: Any) -> None:
        super().__init__(vocab)
        # Our own cache sits above the backends; xgrammar's would only duplicate memory.
        self._compiler = xgr.GrammarCompiler(vocab.xgrammar_info, max_threads=1, cache_enabled=False)

    def compile_json_schema(self, schema: dict[str, Any] | bool, options: JsonOptions) -> XGrammarCompiled:
        return self._compile(_json_grammar(schema, options))

    def compile_tools(self, calls: ToolCalls, options: JsonOptions) -> XGrammarCompiled:
        """A structural tag in the calls' own syntax (``calls.tool_format``): each function's call is
        a tag whose begin names it and whose content is its parameters' JSON grammar. A format the
        registries keep brings its own tag (``registry_tag``)."""
        if isinstance(calls.tool_format, RegistryFormat):
            return self._compile(_structural_grammar(registry_tag(calls, options)))
        syntax = calls.tool_format.syntax
        tags = [
            {
                "type": "tag",
                "begin": syntax.begin(tool.name),
                "content": {
                    "type": "grammar",
                    "grammar": str(
                        _json_grammar(
                            tool.parameters,
                            replace(options, strict_properties=tool.strict),
                            pointer=f"/tools/{i}/parameters",
                            layout=calls.arguments_layout,
                        )
                    ),
                },
                "end": syntax.call_end,
            }
            for i, tool in enumerate(calls.tools)
        ]
        # With an answer format the calls part is the required form, and the answer the other branch.
        calls_only = calls.required or calls.answer is not None
        listed = {
            "type": "tags_with_separator",
            "tags": tags,
            "separator": syntax.separator,
            "at_least_one": True,
            "stop_after_first": not calls.parallel,
        }
        form: dict[str, Any]
        if syntax.section_begin:  # one section holds the call list (Mistral's [TOOL_CALLS] [...])
            section = {"type": "tag", "begin": syntax.section_begin, "content": listed, "end": syntax.section_end}
            form = (
                section
                if calls_only
                else {
                    "type": "triggered_tags",
                    "triggers": [syntax.trigger],
                    "tags": [section],
                    "stop_after_first": True,
                }
            )
        elif calls_only:
            form = listed
        else:
            form = {
                "type": "triggered_tags",
                "triggers": [syntax.trigger],
                "tags": tags,
                "stop_after_first": not calls.parallel,
            }
        if calls.answer is not None:
            form = _or_answer(form, calls, options)
        return self._compile(_structural_grammar(form))

    def compile_structural_tag(self, tag: dict[str, Any]) -> XGrammarCompiled:
        """Either form vLLM accepts: the legacy ``structures`` and ``triggers`` go through xgrammar's
        own conversion (``from_structural_tag(tags, triggers)``), as in vLLM's xgrammar backend."""
        try:
            if "structures" in tag:
                items = [
                    xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s["schema"]), end=s["end"])
                    for s in tag["structures"]
                ]
                grammar = xgr.Grammar.from_structural_tag(items, tag["triggers"])
            else:
                grammar = xgr.Grammar.from_structural_tag(json.dumps(tag))
        except (RuntimeError, ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
            raise GrammarSyntaxError(f"xgrammar cannot build the structural tag: {_first_line(exc)}") from None
        return self._compile(grammar)

    def compile_ebnf(self, grammar: str) -> XGrammarCompiled:
        try:
            parsed = xgr.Grammar.from_ebnf(grammar)
        except RuntimeError as exc:
            message = _clean(exc)
            where = _LINE_COL.search(message)
            raise GrammarSyntaxError(
                _LINE_COL.sub("", message).replace(" :", ":"),
                line=int(where.group(1)) if where else None,
                column=int(where.group(2)) if where else None,
            ) from None
        except UnicodeDecodeError:
            raise GrammarSyntaxError("EBNF " + _undecodable(grammar)) from None
        loop = _repeats_itself(str(parsed))
        if loop is not None:
            raise GrammarSyntaxError(
                f"rule {loop[0]} is only a repetition of itself ({' -> '.join(loop)}): it has no content of "
                "its own to repeat; repeat what the rule should contain instead"
            )
        return self._compile(parsed)

    def compile_regex(self, pattern: str) -> XGrammarCompiled:
        try:
            parsed = xgr.Grammar.from_regex(pattern)
        except RuntimeError as exc:
            message = _clean(exc)
            where = _POSITION.search(message)
            raise RegexError(
                _POSITION.sub("", message).replace(" :", ":"),
                line=1 if where else None,
                column=int(where.group(1)) + 1 if where else None,
            ) from None
        except UnicodeDecodeError:
            raise RegexError("regex " + _undecodable(pattern)) from None
        return self._compile(parsed)

    def _compile(self, grammar: xgr.Grammar) -> XGrammarCompiled:
        try:
            return XGrammarCompiled(self._compiler.compile_grammar(grammar), grammar)
        except RuntimeError as exc:
            raise CompileFailed(f"xgrammar failed to compile: {_clean(exc)}") from None


def _repeats_itself(printed: str) -> list[str] | None:
    """The rules of a cycle in which each rule is only a reference to the next, at least one of them
    repeated (``root ::= root{2,3}``; ``root ::= x{2}`` with ``x ::= (root)``), in xgrammar's print
    of a parsed grammar; ``None`` if there is none. xgrammar 0.2.8 expands such a repetition by
    following the references without end and dies of a stack overflow (SIGSEGV), found by
    fuzz/fuzz_ebnf.py. Such a rule has no content of its own to repeat: where the count allows
    none it writes nothing, else it never ends. Each rule has one body, so the rules form chains
    of single links and any cycle is found by following them, each rule once (a hostile grammar
    may chain thousands)."""
    links: dict[str, tuple[str, bool]] = {}
    for line in printed.splitlines():
        found = _LONE_REFERENCE.match(line)
        if found is not None:
            links[found.group(1)] = (found.group(2), found.group(3) is not None)
    done: set[str] = set()  # rules whose chain has been followed: each is walked once
    for start in links:
        walk: dict[str, int] = {}  # the rules of this walk, by position
        name = start
        while name in links and name not in done and name not in walk:
            walk[name] = len(walk)
            name = links[name][0]
        if name in walk:  # the walk came back to one of its own rules: a cycle from there
            cycle = list(walk)[walk[name] :]
            if any(links[rule][1] for rule in cycle):
                return [*cycle, name]
        done.update(walk)
    return None


def _json_grammar(
    schema: dict[str, Any] | bool, options: JsonOptions, pointer: str = "", layout: JsonLayout | None = None
) -> xgr.Grammar:
    """A JSON Schema as an xgrammar grammar, with tokenmold's whitespace and strictness choices
    (what only llguidance enforces folded: xgrammar has no key patterns and takes one string
    constraint). ``layout`` fixes the layout whatever ``options.max_whitespace`` says (tool calls'
    arguments under budget fitting, as the llguidance backend writes them: ``json_layout``)."""
    free = options.max_whitespace > 0 and layout is None
    layout = layout or COMPACT
    try:
        return xgr.Grammar.from_json_schema(
            json.dumps(fold_llguidance_only(schema)),
            any_whitespace=free,
            max_whitespace_cnt=options.max_whitespace if free else None,
            separators=None if free else (layout.item, layout.key),
            strict_mode=options.strict_properties,
        )
    except RuntimeError as exc:
        raise SchemaError(f"xgrammar cannot convert the schema: {_clean(exc)}", pointer=pointer) from None
    except UnicodeDecodeError:
        message = _undecodable(json.dumps(schema, ensure_ascii=False))
        raise SchemaError(f"xgrammar cannot convert the schema: {message}", pointer=pointer) from None


def _structural_grammar(form: dict[str, Any]) -> xgr.Grammar:
    try:
        return xgr.Grammar.from_structural_tag(json.dumps({"type": "structural_tag", "format": form}))
    except (RuntimeError, ValueError) as exc:
        raise CompileFailed(f"xgrammar cannot build the tool-call grammar: {_clean(exc)}", keyword="tools") from None


def registry_tag(calls: ToolCalls, options: JsonOptions) -> dict[str, Any]:
    """The registry's tag for ``calls`` (``RegistryFormat.structural_tag``, from the normalized
    parameters), where each JSON-style content that is a tool's whole arguments becomes
    tokenmold's own JSON grammar of them (the one the written formats use: its whitespace,
    strictness per function, what only llguidance enforces folded). Contents in another style
    (Qwen3-Coder's and MiniMax's XML parameters, GLM's key/value pairs, a pythonic keyword's value)
    stay the registry's, compiled by xgrammar from the same normalized schema."""
    fmt = calls.tool_format
    assert isinstance(fmt, RegistryFormat)
    if calls.answer is not None:
        raise CompileFailed(
            f"a response format with tools needs a tool-call format written by tokenmold (hermes, llama3_json, "
            f"mistral); {fmt.name} is the registry's",
            keyword="tools",
        )
    # One layout, ``json.dumps``' (``json_layout.ARGUMENTS``), not the free one of the written
    # formats: several of vLLM's parsers read a call with a regular expression whose ``.`` stops at
    # a line break (DeepSeek V3.1's).
    grammars = {
        json.dumps(tool.parameters, sort_keys=True): str(
            _json_grammar(
                tool.parameters,
                replace(options, strict_properties=tool.strict),
                pointer=f"/tools/{i}/parameters",
                layout=ARGUMENTS,
            )
        )
        for i, tool in enumerate(calls.tools)
    }

    def own(node: Any) -> Any:
        if isinstance(node, list):
            return [own(item) for item in node]
        if not isinstance(node, dict):
            return node
        if node.get("type") == "json_schema" and node.get("style", "json") == "json":
            grammar = grammars.get(json.dumps(node.get("json_schema"), sort_keys=True))
            if grammar is not None:
                return {"type": "grammar", "grammar": grammar}
        return {key: own(value) for key, value in node.items()}

    return dict(own(fmt.structural_tag(calls.tools, required=calls.required, parallel=calls.parallel)))


def _or_answer(calls_form: dict[str, Any], calls: ToolCalls, options: JsonOptions) -> dict[str, Any]:
    """Tool calls or a direct answer in the caller's format, as one structural tag: the output
    begins either with the call tag or with the answer's JSON, never with free text."""
    assert calls.answer is not None
    answer = _json_grammar(calls.answer, replace(options, strict_properties=calls.answer_strict), pointer="/answer")
    return {"type": "or", "elements": [calls_form, {"type": "grammar", "grammar": str(answer)}]}
