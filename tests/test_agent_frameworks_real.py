"""Two agent frameworks against the port on the real bundled model (issue 26; ``model`` marker).

openai-agents and pydantic-ai each run an agent with one tool and a pydantic ``output_type`` whose ``Field(ge=1,
le=5)`` bounds an integer, through the ``openai`` client pointed at the port, on chat completions and on
``/v1/responses``. Gemma 3 270M is a base model: it never calls a tool by choice, so each test forces the first
call the way its framework allows (openai-agents: ``tool_choice="required"`` kept on every turn with
``reset_tool_choice=False``, and the port answers the turn after the tool result in the format; pydantic-ai: a
per-step ``tool_choice``, the tool on the first step and ``"none"`` after, with the output as ``NativeOutput``
(``response_format``) or ``ToolOutput`` (a ``final_result`` call)). Hearth's grammars make the call and the
answer well-formed. Each API runs whole and streamed (one framework each). The tests check the tool ran (a list
it appends to) and the result is a validated instance within its bounds. A bound the grammar cannot enforce (a
``float`` in ``[0, 5]``) is either kept or a 422 naming it: never a wrong value returned silently. Greedy
(temperature 0), short (max_tokens 60), no network: tracing is off and both frameworks only talk to the port.
"""

from __future__ import annotations

import asyncio

import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    function_tool,
)
from engine_runs import served
from openai import AsyncOpenAI
from pydantic import BaseModel, Field
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import NativeOutput, RunContext, ToolOutput
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.models.openai import OpenAIResponsesModel as PydanticResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings as PydanticSettings

pytestmark = pytest.mark.model

MODEL = "gemma-3-270m-q4_k_m"
INSTRUCTIONS = "Rate products from their reviews."
# Naming the product in quotes: without it the base model's greedy argument for pydantic-ai's tool schema
# degenerates into digits until max_tokens (the call then comes back as text with hearth.tool_call_error).
PROMPT = 'Rate the product "Acme kettle" from its reviews: look them up first.'
REVIEWS = '{"average_stars": 4.2, "reviews": 120, "common_praise": "boils fast"}'


class Rating(BaseModel):
    score: int = Field(ge=1, le=5, description="stars, 1 to 5")
    summary: str = Field(max_length=40)


class StarRating(BaseModel):
    stars: float = Field(ge=0, le=5, description="average stars")
    summary: str = Field(max_length=40)


@pytest.fixture(scope="module")
def port(bundled_model):
    with served(bundled_model, max_queue=8) as srv:
        yield f"{srv.url}/v1"


def client(base_url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)


def rater(base_url: str, api: str, output_type: type, looked_up: list[str]) -> Agent:
    """An openai-agents agent on the port: one tool (appending to ``looked_up``), ``tool_choice="required"``
    on every turn (the port answers the turn after the tool result in ``output_type``'s format)."""

    @function_tool
    def lookup_reviews(product: str) -> str:
        """Customer reviews of a product."""
        looked_up.append(product)
        return REVIEWS

    cls = OpenAIChatCompletionsModel if api == "chat" else OpenAIResponsesModel
    return Agent(name="rater", instructions=INSTRUCTIONS, model=cls(model=MODEL, openai_client=client(base_url)),
                 tools=[lookup_reviews], output_type=output_type, reset_tool_choice=False,
                 model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=60))


def run_agent(agent: Agent, stream: bool = False):
    """``agent``'s result on ``PROMPT`` (at most 3 turns, tracing off), whole answers or streamed ones."""
    config = RunConfig(tracing_disabled=True)
    if not stream:
        return asyncio.run(Runner.run(agent, PROMPT, max_turns=3, run_config=config))

    async def streamed():
        result = Runner.run_streamed(agent, PROMPT, max_turns=3, run_config=config)
        async for _ in result.stream_events():
            pass
        return result
    return asyncio.run(streamed())


@pytest.mark.parametrize("api,stream", [("chat", False), ("responses", True)])
def test_openai_agents_calls_its_tool_and_returns_a_bounded_rating(port, api, stream):
    looked_up: list[str] = []
    result = run_agent(rater(port, api, Rating, looked_up), stream)
    assert looked_up == ["Acme kettle"]
    rating = result.final_output
    assert isinstance(rating, Rating) and 1 <= rating.score <= 5 and len(rating.summary) <= 40


def test_a_bound_the_grammar_cannot_enforce_is_kept_or_a_422_naming_it(port):
    looked_up: list[str] = []
    try:
        rating = run_agent(rater(port, "chat", StarRating, looked_up)).final_output
    except openai.UnprocessableEntityError as exc:  # today's greedy answer copies "reviews": 120 into stars
        assert exc.param == "response_format" and "answer.stars" in exc.message and "imum of" in exc.message
    else:
        assert isinstance(rating, StarRating) and 0 <= rating.stars <= 5
    assert looked_up == ["Acme kettle"]


def first_step_calls(ctx: RunContext) -> PydanticSettings:
    """pydantic-ai's per-step settings: the tool is forced on the first request; after it "none" leaves only the
    output (the ``final_result`` tool, or the answer in ``response_format``)."""
    return PydanticSettings(temperature=0, max_tokens=60, tool_choice=["lookup_reviews"] if ctx.run_step <= 1
                            else "none")


@pytest.mark.parametrize("api,output,stream", [("chat", NativeOutput, True), ("responses", ToolOutput, False)])
def test_pydantic_ai_calls_its_tool_and_returns_a_bounded_rating(port, api, output, stream):
    provider = OpenAIProvider(openai_client=client(port))
    model = (OpenAIChatModel if api == "chat" else PydanticResponsesModel)(MODEL, provider=provider)
    agent = PydanticAgent(model, output_type=output(Rating), instructions=INSTRUCTIONS,
                          model_settings=first_step_calls, retries=0)
    looked_up: list[str] = []

    @agent.tool_plain
    def lookup_reviews(product: str) -> str:
        """Customer reviews of a product."""
        looked_up.append(product)
        return REVIEWS

    async def drain(ctx, events):  # with a handler, each model request is streamed
        async for _ in events:
            pass
    rating = agent.run_sync(PROMPT, event_stream_handler=drain if stream else None).output
    assert looked_up == ["Acme kettle"]
    assert isinstance(rating, Rating) and 1 <= rating.score <= 5 and len(rating.summary) <= 40
