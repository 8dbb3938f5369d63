"""The Responses API on top of the chat path; no HTTP and no engine in here.

A Responses request is rewritten as the chat request it means (``instructions`` and ``input`` items
as messages, ``text.format`` as ``response_format``, function tools as chat tools) and planned by
``translate.chat_plan``: one prompt, grammar, tool and sampling path for both APIs. The chat answer
comes back as a ``response`` object, and a chat stream as the Responses API's named events, so
whatever the chat path learns (tool formats, streamed arguments) reaches this API too. Stored
responses and ``previous_response_id`` are the router's (``stored_responses.py``); here a request
arrives with its conversation whole. ``conversation``, stored ``prompt``\\s and ``item_reference``
inputs are refused with a 400 that says what to send instead.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import replace

from tokenmold.schemas.openai import AllowedTools as ChatAllowedTools
from tokenmold.schemas.openai import (
    AllowedToolsChoice,
    AnyToolChoice,
    AnyToolDefinition,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    ChatUsage,
    ChoiceVerdict,
    CustomCall,
    CustomGrammar,
    CustomName,
    CustomToolCall,
    CustomToolCallDelta,
    CustomToolDefinition,
    FunctionCall,
    FunctionDefinition,
    FunctionName,
    JsonObjectFormat,
    JsonSchemaFormat,
    JsonSchemaSpec,
    NamedCustomToolChoice,
    NamedToolChoice,
    ResponseFormat,
    TokenLogprob,
    ToolCall,
    ToolCallDelta,
    ToolDefinition,
    Validation,
)
from tokenmold.schemas.openai import CustomGrammarFormat as ChatGrammarFormat
from tokenmold.schemas.openai import CustomTool as ChatCustomTool
from tokenmold.schemas.responses import (
    EXTENSIONS,
    AllowedTools,
    ArgumentsDeltaEvent,
    ArgumentsDoneEvent,
    ContentPartEvent,
    CustomChoice,
    CustomGrammarFormat,
    CustomInputDeltaEvent,
    CustomInputDoneEvent,
    CustomTool,
    CustomToolCallItem,
    CustomToolCallOutputItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionChoice,
    FunctionTool,
    IncompleteDetails,
    ItemReference,
    ItemStatus,
    MessageItem,
    OutputCustomToolCall,
    OutputFunctionCall,
    OutputItem,
    OutputItemEvent,
    OutputJsonPartialEvent,
    OutputMessage,
    OutputReasoning,
    OutputText,
    OutputTokensDetails,
    ReasoningText,
    ResponseEvent,
    ResponseLifecycleEvent,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
    TextConfig,
    TextDeltaEvent,
    TextDoneEvent,
    TextFormatJsonObject,
    TextFormatJsonSchema,
    TextFormatText,
    TextPart,
)
from tokenmold.service.api.errors import unaccepted_response
from tokenmold.service.api.translate import ChatStream, Plan, chat_plan, new_id
from tokenmold.service.engine.model_info import ModelInfo
from tokenmold.service.errors import RequestError
from tokenmold.service.request.runtime import StreamDelta

#: Fields that need state this server does not keep, and what to send instead.
_STATEFUL = {
    "conversation": "send the whole conversation as input items, or previous_response_id",
    "prompt": "send the prompt's text as instructions and input",
}

#: The chat request's field names as the Responses request names them (an error's ``param``).
_PARAMS = {
    "response_format.json_schema.schema": "text.format.schema",
    "response_format": "text.format",
    "messages": "input",
    "max_completion_tokens": "max_output_tokens",
    "tool_choice.allowed_tools.tools": "tool_choice.tools",
    "tool_choice.custom.name": "tool_choice.name",
}
#: A custom tool's grammar, ``tools[i].custom.format.grammar.definition`` in chat terms.
_CUSTOM_GRAMMAR = re.compile(r"^tools\[(\d+)\]\.custom\.format\.grammar\.definition$")

_LOGPROBS = "message.output_text.logprobs"


def responses_plan(body: ResponsesRequest, model: ModelInfo) -> Plan:
    """The chat plan of a Responses request."""
    for name, instead in _STATEFUL.items():
        if getattr(body, name) is not None:
            raise RequestError(f"{name} is not served here: {instead}", param=name)
    logprobs = _LOGPROBS in (body.include or [])
    tools, choice = _tools(body)
    chat = ChatCompletionRequest(
        model=body.model,
        messages=_messages(body),
        response_format=_response_format(body.text),
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=True if body.parallel_tool_calls is None else body.parallel_tool_calls,
        max_completion_tokens=body.max_output_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        logprobs=logprobs,
        top_logprobs=body.top_logprobs if logprobs else None,
        reasoning_effort=(body.reasoning or {}).get("effort"),
        **body.model_dump(include=set(EXTENSIONS), exclude_none=True, by_alias=True),
    )
    try:
        plan = chat_plan(chat, model)
    except RequestError as exc:
        exc.param = _param(exc.param)
        raise
    return replace(plan, shape_param=_param(plan.shape_param))


def _param(chat_param: str | None) -> str | None:
    """A chat request's field name as the Responses request names it."""
    if chat_param is None:
        return None
    return _CUSTOM_GRAMMAR.sub(r"tools[\1].format.definition", _PARAMS.get(chat_param, chat_param))


def _messages(body: ResponsesRequest) -> list[ChatMessage]:
    """``instructions`` as the system message, then the input items as chat messages: consecutive
    function calls join the assistant message before them, each output is a ``tool`` message."""
    out = [ChatMessage(role="system", content=body.instructions)] if body.instructions else []
    items = [MessageItem(role="user", content=body.input)] if isinstance(body.input, str) else body.input
    for i, item in enumerate(items):
        if isinstance(item, MessageItem):
            out.append(ChatMessage(role=item.role, content=_text(item.content)))
        elif isinstance(item, FunctionCallItem):
            call = ToolCall(id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments))
            if out and out[-1].role == "assistant":
                out[-1].tool_calls = [*(out[-1].tool_calls or []), call]
            else:
                out.append(ChatMessage(role="assistant", tool_calls=[call]))
        elif isinstance(item, CustomToolCallItem):
            custom = CustomToolCall(id=item.call_id, custom=CustomCall(name=item.name, input=item.input))
            if out and out[-1].role == "assistant":
                out[-1].custom_tool_calls = [*(out[-1].custom_tool_calls or []), custom]
            else:
                out.append(ChatMessage(role="assistant", custom_tool_calls=[custom]))
        elif isinstance(item, FunctionCallOutputItem | CustomToolCallOutputItem):
            out.append(ChatMessage(role="tool", tool_call_id=item.call_id, content=_text(item.output)))
        elif isinstance(item, ItemReference):
            raise RequestError(
                f"input[{i}] refers to the stored item {item.id!r}; items are not kept by reference here:"
                " send the item itself",
                param=f"input[{i}]",
            )
        # A reasoning item is dropped: earlier thinking is not part of the prompt.
    if not any(m.role != "system" for m in out):
        raise RequestError("input has no message to answer", param="input")
    return out


def _text(content: str | list[TextPart]) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.refusal if part.type == "refusal" else part.text for part in content)


def _response_format(text: TextConfig | None) -> ResponseFormat | None:
    fmt = text.format if text else None
    if isinstance(fmt, TextFormatJsonSchema):
        spec = JsonSchemaSpec(name=fmt.name, description=fmt.description, schema=fmt.schema_, strict=fmt.strict)
        return JsonSchemaFormat(type="json_schema", json_schema=spec)
    if isinstance(fmt, TextFormatJsonObject):
        return JsonObjectFormat(type="json_object")
    return None


def _tools(body: ResponsesRequest) -> tuple[list[AnyToolDefinition] | None, AnyToolChoice | None]:
    """Function tools as chat tools (strict unless a tool says otherwise: the Responses API's
    default), and ``tool_choice`` in the chat API's form."""
    tools: list[AnyToolDefinition] = [
        ToolDefinition(
            type="function",
            function=FunctionDefinition(
                name=t.name,
                description=t.description,
                parameters=t.parameters,
                strict=True if t.strict is None else t.strict,
            ),
        )
        if isinstance(t, FunctionTool)
        else _custom_tool(t)
        for t in body.tools or []
    ]
    choice = body.tool_choice
    if isinstance(choice, FunctionChoice):
        return tools or None, _named(choice)
    if isinstance(choice, CustomChoice):
        return tools or None, NamedCustomToolChoice(type="custom", custom=CustomName(name=choice.name))
    if isinstance(choice, AllowedTools):
        allowed = ChatAllowedTools(mode=choice.mode, tools=[_named(entry) for entry in choice.tools])
        return tools or None, AllowedToolsChoice(type="allowed_tools", allowed_tools=allowed)
    return tools or None, choice


def _custom_tool(tool: CustomTool) -> CustomToolDefinition:
    """A custom tool in the chat API's form (its grammar one level deeper)."""
    fmt = tool.format
    grammar = (
        ChatGrammarFormat(type="grammar", grammar=CustomGrammar(syntax=fmt.syntax, definition=fmt.definition))
        if isinstance(fmt, CustomGrammarFormat)
        else None
    )
    return CustomToolDefinition(
        type="custom", custom=ChatCustomTool(name=tool.name, description=tool.description, format=grammar)
    )


def _named(choice: FunctionChoice) -> NamedToolChoice:
    return NamedToolChoice(type="function", function=FunctionName(name=choice.name))


# ---------------------------------------------------------------- the response object


def response_shell(body: ResponsesRequest, *, model: str, stored: bool = False) -> ResponseObject:
    """The response before its output: a new id and the request's settings echoed; ``stored``:
    whether it is kept (its ``store``)."""
    return ResponseObject(
        id=new_id("resp"),
        created_at=int(time.time()),
        status="in_progress",
        instructions=body.instructions,
        max_output_tokens=body.max_output_tokens,
        model=model,
        parallel_tool_calls=True if body.parallel_tool_calls is None else body.parallel_tool_calls,
        temperature=body.temperature,
        top_p=body.top_p,
        tool_choice=body.tool_choice or "auto",
        tools=body.tools or [],
        text=body.text if body.text and body.text.format else TextConfig(format=TextFormatText(type="text")),
        truncation=body.truncation or "disabled",
        metadata=body.metadata or {},
        user=body.user,
        previous_response_id=body.previous_response_id,
        store=stored,
    )


def finished(
    shell: ResponseObject,
    output: list[OutputItem],
    *,
    finish: str | None,
    usage: ChatUsage,
    validation: Validation | None,
) -> ResponseObject:
    """``shell`` completed (or, cut off by the token limit, incomplete) with its output."""
    cut = finish == "length"
    reasoning = usage.completion_tokens_details.reasoning_tokens if usage.completion_tokens_details else 0
    return shell.model_copy(
        update={
            "status": "incomplete" if cut else "completed",
            "incomplete_details": IncompleteDetails(reason="max_output_tokens") if cut else None,
            "output": output,
            "usage": ResponseUsage(
                input_tokens=usage.prompt_tokens,
                output_tokens=usage.completion_tokens,
                output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning),
                total_tokens=usage.total_tokens,
            ),
            "validation": validation,
        }
    )


def response_from_chat(completion: ChatCompletion, shell: ResponseObject) -> ResponseObject:
    """The chat answer (one choice) as output items: reasoning, the message, then each call."""
    choice = completion.choices[0]
    message = choice.message
    status: ItemStatus = "incomplete" if choice.finish_reason == "length" else "completed"
    output: list[OutputItem] = []
    if message.reasoning_content:
        output.append(
            OutputReasoning(id=new_id("rs"), content=[ReasoningText(text=message.reasoning_content)], status=status)
        )
    if message.content is not None or not message.tool_calls:
        logprobs = choice.logprobs.content if choice.logprobs else None
        text = OutputText(text=message.content or "", logprobs=logprobs)
        output.append(OutputMessage(id=new_id("msg"), status=status, content=[text]))
    output += [
        OutputFunctionCall(
            id=new_id("fc"),
            call_id=call.id,
            name=call.function.name,
            arguments=call.function.arguments,
            status="completed",
        )
        if isinstance(call, ToolCall)
        else OutputCustomToolCall(
            id=new_id("ctc"), call_id=call.id, name=call.custom.name, input=call.custom.input, status="completed"
        )
        for call in message.tool_calls or []
    ]
    return finished(shell, output, finish=choice.finish_reason, usage=completion.usage, validation=choice.validation)


# ---------------------------------------------------------------- streaming


class ResponsesStream:
    """``Runtime.stream`` deltas, through ``ChatStream``, to the Responses API's events (``Frames``).

    ``response.created`` and ``.in_progress`` open the stream. Output items come one after the other:
    each is announced (``output_item.added``; a message or reasoning item then opens its one part,
    ``content_part.added``), grows by deltas (``output_text.delta``, ``reasoning_text.delta``,
    ``function_call_arguments.delta``) and is closed (``*.done``, ``content_part.done``,
    ``output_item.done``) when the next item starts or the output ends. With ``partials``, a text
    delta that closes parts of the JSON answer is followed by ``output_json.partial`` with them.
    ``response.completed``
    (``.incomplete`` when cut off) carries the whole response with its usage and ``validation``.
    Tool calls stream as the chat stream releases them.
    """

    def __init__(
        self,
        plan: Plan,
        shell: ResponseObject,
        *,
        model: str,
        on_finished: Callable[[ResponseObject], object] | None = None,
    ) -> None:
        self.chat = ChatStream(plan, model=model)
        self.shell = shell
        #: Told the finished response (the store keeps it), unless it was rejected.
        self.on_finished = on_finished
        self.output: list[OutputItem] = []
        self._sequence = 0
        #: The output index of the item being written, and what it is ("output_text",
        #: "reasoning_text", or a chat tool call's index).
        self._open: tuple[int, str | int] | None = None
        self._finish: str | None = None
        self._validation: Validation | None = None

    def events(self, delta: StreamDelta) -> list[str]:
        out: list[ResponseEvent] = []
        if self._sequence == 0:
            out += [
                ResponseLifecycleEvent(type=kind, response=self.shell)
                for kind in ("response.created", "response.in_progress")
            ]
        for chunk in self.chat.chunks(delta):
            out += self._from_chunk(chunk)
        return [self._frame(event) for event in out]

    def closing(self, rejected: list[ChoiceVerdict]) -> list[str]:
        if rejected:  # 422 mode: the error body (the SDK raises it) instead of the response
            body = bytes(unaccepted_response(rejected).body).decode()
            return [f"event: error\ndata: {body}\n\n"]
        usage = self.chat.usage_chunk().usage or ChatUsage.of(0, 0)
        response = finished(self.shell, self.output, finish=self._finish, usage=usage, validation=self._validation)
        kind = "response.incomplete" if response.status == "incomplete" else "response.completed"
        if self.on_finished is not None:
            self.on_finished(response)
        return [self._frame(ResponseLifecycleEvent(type=kind, response=response))]

    def _frame(self, event: ResponseEvent) -> str:
        event.sequence_number = self._sequence
        self._sequence += 1
        return f"event: {event.type}\ndata: {event.model_dump_json()}\n\n"

    def _from_chunk(self, chunk: ChatCompletionChunk) -> list[ResponseEvent]:
        out: list[ResponseEvent] = []
        for choice in chunk.choices:
            piece = choice.delta
            if piece.reasoning_content:
                out += self._part_delta("reasoning_text", piece.reasoning_content, [])
            if piece.content:
                logprobs = choice.logprobs.content if choice.logprobs and choice.logprobs.content else []
                out += self._part_delta("output_text", piece.content, logprobs)
            if piece.partials and self._open is not None:
                index = self._open[0]
                out.append(
                    OutputJsonPartialEvent(item_id=self.output[index].id, output_index=index, partials=piece.partials)
                )
            for call in piece.tool_calls or []:
                out += self._custom_delta(call) if isinstance(call, CustomToolCallDelta) else self._call_delta(call)
            if choice.finish_reason is not None:
                self._finish, self._validation = choice.finish_reason, choice.validation
                out += self._close("incomplete" if self._finish == "length" else "completed")
        return out

    def _start(self, item: OutputItem, what: str | int) -> list[ResponseEvent]:
        """Close the open item and announce ``item``."""
        out = self._close("completed")
        self.output.append(item)
        self._open = (len(self.output) - 1, what)
        return [*out, OutputItemEvent(type="response.output_item.added", output_index=self._open[0], item=item)]

    def _part_delta(self, kind: str, text: str, logprobs: list[TokenLogprob]) -> list[ResponseEvent]:
        """Text of a message (``output_text``) or of a reasoning item (``reasoning_text``)."""
        out: list[ResponseEvent] = []
        if self._open is None or self._open[1] != kind:
            item: OutputItem
            if kind == "output_text":
                part: OutputText | ReasoningText = OutputText(text="", logprobs=[] if logprobs else None)
                item = OutputMessage(id=new_id("msg"), status="in_progress", content=[])
            else:
                part = ReasoningText(text="")
                item = OutputReasoning(id=new_id("rs"), status="in_progress", content=[])
            out += self._start(item, kind)
            out.append(
                ContentPartEvent(
                    type="response.content_part.added", item_id=item.id, output_index=len(self.output) - 1, part=part
                )
            )
            item.content.append(part)  # type: ignore[arg-type]  # the part made for this item's kind
        assert self._open is not None
        index = self._open[0]
        item = self.output[index]
        assert isinstance(item, OutputMessage | OutputReasoning)
        grown = item.content[0]
        grown.text += text
        if isinstance(grown, OutputText) and grown.logprobs is not None:
            grown.logprobs += logprobs
        out.append(
            TextDeltaEvent(
                type=f"response.{kind}.delta", item_id=item.id, output_index=index, delta=text, logprobs=logprobs
            )
        )
        return out

    def _call_item(self, call: int, make: Callable[[], OutputItem]) -> tuple[list[ResponseEvent], int]:
        """The output index of call ``call``'s item, opened with ``make`` (from the call's first delta,
        which carries its id and name) unless it is the open item, and the events that opened it."""
        out = [] if self._open is not None and self._open[1] == call else self._start(make(), call)
        assert self._open is not None
        return out, self._open[0]

    def _call_delta(self, call: ToolCallDelta) -> list[ResponseEvent]:
        """A call opens on its first delta (id and name) and grows by its argument fragments."""
        out, index = self._call_item(
            call.index,
            lambda: OutputFunctionCall(
                id=new_id("fc"),
                call_id=call.id or "",
                name=call.function.name or "",
                arguments="",
                status="in_progress",
            ),
        )
        opened = self.output[index]
        assert isinstance(opened, OutputFunctionCall)
        if call.function.arguments:
            opened.arguments += call.function.arguments
            out.append(ArgumentsDeltaEvent(item_id=opened.id, output_index=index, delta=call.function.arguments))
        return out

    def _custom_delta(self, call: CustomToolCallDelta) -> list[ResponseEvent]:
        """A custom tool's call: opened by its first delta (id and name), grown by its input."""
        out, index = self._call_item(
            call.index,
            lambda: OutputCustomToolCall(
                id=new_id("ctc"), call_id=call.id or "", name=call.custom.name or "", input="", status="in_progress"
            ),
        )
        opened = self.output[index]
        assert isinstance(opened, OutputCustomToolCall)
        if call.custom.input:
            opened.input += call.custom.input
            out.append(CustomInputDeltaEvent(item_id=opened.id, output_index=index, delta=call.custom.input))
        return out

    def _close(self, status: ItemStatus) -> list[ResponseEvent]:
        """The open item's closing events; ``status`` is ``incomplete`` when the output was cut off
        (a call streamed so far and cut off by the token limit stays an incomplete item)."""
        if self._open is None:
            return []
        index, self._open = self._open[0], None
        item = self.output[index]
        item.status = status
        out: list[ResponseEvent] = []
        if isinstance(item, OutputFunctionCall):
            out.append(
                ArgumentsDoneEvent(item_id=item.id, output_index=index, name=item.name, arguments=item.arguments)
            )
        elif isinstance(item, OutputCustomToolCall):
            out.append(CustomInputDoneEvent(item_id=item.id, output_index=index, input=item.input))
        else:
            part = item.content[0]
            kind = part.type
            logprobs = (part.logprobs or []) if isinstance(part, OutputText) else []
            out += [
                TextDoneEvent(
                    type=f"response.{kind}.done", item_id=item.id, output_index=index, text=part.text, logprobs=logprobs
                ),
                ContentPartEvent(type="response.content_part.done", item_id=item.id, output_index=index, part=part),
            ]
        return [*out, OutputItemEvent(type="response.output_item.done", output_index=index, item=item)]
