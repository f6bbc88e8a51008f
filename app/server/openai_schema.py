"""Request bodies of the OpenAI API subset Hearth serves, as pydantic models.

``extra="allow"`` where OpenAI itself accepts fields Hearth does not use (``user``, ``store``, ``metadata``,
``service_tier``…): they are accepted and ignored, so clients that send them keep working. Fields whose
silent omission would change the answer (functions, echo, suffix, images, audio) are checked in
``app.server.convert`` and refused with a 400 naming them; ``tools`` and ``tool_choice`` are checked there
too (``app.engine.chat.tools``), since their errors name paths inside them.

The reasoning: docs/server.md, 'app/server/openai_schema.py'.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from app.assistant.evidence import MAX_K as MAX_EVIDENCE  # passages one request may ask for (hearth.k)

MAX_N = 8  # n > 1 runs n generations one after another; more than this is refused
MAX_DEADLINE_S = 1e6  # hearth.deadline_s upper bound, seconds (GenerateRequest.validate's)


class _Allow(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Allow):
    include_usage: Optional[StrictBool] = None


class JsonSchemaSpec(_Allow):
    name: str = "response"
    description: Optional[str] = None
    schema_: Optional[dict[str, Any]] = Field(default=None, alias="schema")
    strict: Optional[StrictBool] = None


class ResponseFormat(_Allow):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaSpec] = None


class ChatMessageIn(_Allow):
    """One message. ``content``: a string or a list of content parts (only ``{"type": "text"}`` parts are
    supported), null on an assistant message with ``tool_calls``; ``tool_calls``: OpenAI's
    ``[{id, type: "function", function: {name, arguments}}]`` (checked in ``convert``); ``tool_call_id``: on a
    ``tool`` message, the call it answers; ``name`` is kept on tool messages and otherwise ignored."""

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Optional[Union[str, list[dict[str, Any]]]] = None
    name: Optional[str] = None
    tool_calls: Optional[list[Any]] = None
    tool_call_id: Optional[str] = None


class HearthOptions(BaseModel):
    """``"hearth": {"documents": true, "k": 4, "deadline_s": 30}``: answer from the indexed documents (RAG)
    with ``k`` passages (default: the server's, 4; see ``app.server.documents``); ``deadline_s``: seconds from
    the engine receiving a generation (queue wait included) to its end, when the answer so far is returned
    with finish_reason "length" (a number > 0; None: no deadline).

    Thinking (docs/reasoning.md): ``reasoning_budget`` (thinking tokens), ``reasoning_deadline_s`` (seconds
    until thinking is ended), ``answer_now`` (a line inserted after a forced end of thinking);
    ``speculative`` ("auto" | "prompt_lookup" | "draft" | "off" | null); ``self_consistency`` ``{n, extract,
    verifier}``. Those
    are typed ``Any`` here on purpose: the core's validators (``reasoning_budget.resolve_budget``,
    ``GenerateRequest.validate``, ``consistency.parse_self_consistency``) check them and name the field, the
    same way for the port and the window."""

    model_config = ConfigDict(extra="forbid")
    documents: Optional[StrictBool] = Field(default=None, description="retrieve evidence from the documents")
    k: Optional[StrictInt] = Field(default=None, ge=1, le=MAX_EVIDENCE, description="passages to retrieve")
    deadline_s: Optional[float] = Field(default=None, gt=0.0, le=MAX_DEADLINE_S, strict=True, allow_inf_nan=False,
                                        description="seconds until the answer is cut short (finish_reason length)")
    reasoning_budget: Any = Field(default=None, description="thinking tokens allowed (an integer >= 0)")
    reasoning_deadline_s: Any = Field(default=None, description="seconds from the start until thinking ends")
    answer_now: Any = Field(default=None, description="text inserted after a forced end of thinking")
    speculative: Any = Field(default=None, description='"auto", "prompt_lookup", "draft", "off" or null (the '
                             'model\'s default: adaptive prompt lookup where it pays)')
    self_consistency: Any = Field(default=None, description="{n, extract, verifier}: sample n, vote")
    keep_alive: Any = Field(default=None, description='how long the model stays loaded after: seconds or "5m"')
    mcp_tools: Optional[StrictBool] = Field(default=None, description="run the mcp.json tools server-side (needs "
                                            "`hearth serve --mcp-tools`; only alwaysAllow tools run)")


class _Sampling(_Allow):
    """Parameters shared by chat and text completions (plus llama.cpp extensions: top_k, min_p,
    typical_p, repeat_penalty)."""

    model: Optional[str] = Field(default=None, description="model id from /v1/models (default: the loaded one)")
    temperature: Optional[float] = Field(default=None, ge=0.0, le=2.0, strict=True)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0, strict=True)
    top_k: Optional[StrictInt] = Field(default=None, ge=0)
    min_p: Optional[float] = Field(default=None, ge=0.0, le=1.0, strict=True)
    typical_p: Optional[float] = Field(default=None, gt=0.0, le=1.0, strict=True)
    repeat_penalty: Optional[float] = Field(default=None, gt=0.0, le=10.0, strict=True)
    presence_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0, strict=True)
    frequency_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0, strict=True)
    max_tokens: Optional[StrictInt] = None
    stop: Optional[Union[str, list[str]]] = None
    seed: Optional[StrictInt] = None
    logit_bias: Optional[dict[str, float]] = None
    n: StrictInt = Field(default=1, ge=1, le=MAX_N)
    stream: StrictBool = False
    stream_options: Optional[StreamOptions] = None
    user: Optional[str] = None  # accepted, ignored
    reasoning_effort: Any = Field(default=None, description="none | low | medium | high (thinking budget)")
    keep_alive: Any = Field(default=None, description='Ollama-style: seconds or "5m"; 0 unloads, -1 keeps')
    hearth: Optional[HearthOptions] = None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessageIn] = Field(..., description="the conversation; at least one message")
    max_completion_tokens: Optional[StrictInt] = None
    logprobs: Optional[StrictBool] = None
    top_logprobs: Optional[StrictInt] = Field(default=None, ge=0, le=20)
    response_format: Optional[ResponseFormat] = None
    tools: Optional[list[Any]] = None
    tool_choice: Optional[Any] = None
    parallel_tool_calls: Optional[StrictBool] = None
    functions: Optional[list[Any]] = None
    function_call: Optional[Any] = None


class CompletionRequest(_Sampling):
    prompt: Union[str, list[str], list[int], list[list[int]]] = Field(..., description="text or list of texts")
    logprobs: Optional[StrictInt] = Field(default=None, ge=0, le=5)
    echo: Optional[StrictBool] = None
    suffix: Optional[str] = None
    best_of: Optional[StrictInt] = None
    response_format: Optional[ResponseFormat] = None


class EmbeddingRequest(_Allow):
    """``POST /v1/embeddings``. ``input``: a string, a list of strings, a list of token ids (one input) or a
    list of lists of token ids; checked item by item in ``app.server.embeddings.inputs`` so errors name it."""

    input: Union[str, list[Any]] = Field(..., description="text, texts, token ids or lists of token ids")
    model: Optional[str] = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[StrictInt] = None
    user: Optional[str] = None


class ResponsesRequest(_Allow):
    """``POST /v1/responses`` (OpenAI's Responses API; ``app.server.responses`` maps it onto a chat request).
    ``input``: a string or a list of items (messages, ``function_call``, ``function_call_output``,
    ``reasoning``); checked item by item there, so errors name ``input[i]...``."""

    model: Optional[str] = None
    input: Union[str, list[dict[str, Any]]] = Field(..., description="text, or a list of input items")
    instructions: Optional[str] = None
    previous_response_id: Optional[str] = None
    store: StrictBool = True
    stream: StrictBool = False
    max_output_tokens: Optional[StrictInt] = None
    temperature: Optional[float] = Field(default=None, ge=0.0, le=2.0, strict=True)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0, strict=True)
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Any] = None
    parallel_tool_calls: Optional[StrictBool] = None
    text: Optional[dict[str, Any]] = None
    reasoning: Optional[dict[str, Any]] = None
    metadata: Optional[dict[str, Any]] = None
    user: Optional[str] = None
    keep_alive: Any = None
    hearth: Optional[HearthOptions] = None
