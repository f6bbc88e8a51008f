"""The ``agent`` workload of ``hearth bench load``: agent sessions across a server restart.

An agent framework sends the same long preamble (tool definitions and instructions) at the start of every
request, then the session so far: each step's prompt is the previous step's prompt, its answer and the new
observation. This module builds that text (pure, deterministic from a ``random.Random``) and runs the
phases against a target that the benchmark can restart (``run_phases``: the clocks are defined there).

Text sizes are in tokens of the bundled Gemma 3 tokenizer, estimated from characters at the rates measured on
this very text (``PREAMBLE_CHARS_PER_TOKEN``, ``STEP_CHARS_PER_TOKEN``); each request's record keeps the
server's own count (``usage.prompt_tokens``).

- ``preamble(rng, tokens)``: about ``tokens`` tokens (1,500) of instructions and tool definitions, opened by
  a line unique to ``rng`` so that no earlier round's cache holds any of it;
- ``plan_session(rng, preamble, steps, step_tokens, answer_tokens)``: a session: a task and the observation
  of every step, each step adding about ``step_tokens`` tokens (260) to the prompt, the answer included;
- ``Session.prompt(k)``: the prompt of step ``k`` (0-based) = preamble + task + every earlier step and its
  answer + step ``k``'s observation, so prompt ``k + 1`` starts with prompt ``k`` + answer ``k``.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

# Measured with the bundled model's tokenizer (llama_cpp.Llama(vocab_only=True).tokenize, no BOS) over
# preambles of seeds 0-19 and steps of seeds 0-19: characters per token of each kind of text.
PREAMBLE_CHARS_PER_TOKEN = 3.64
STEP_CHARS_PER_TOKEN = 2.38

AGENT_PHASE_NAMES = ("session", "new_session_after_restart", "session_continued_after_restart",
                     "start_to_first_token")
ANSWER_CUE = "\nThought and action:"
STEP_FRAME_TOKENS = 12  # "\nStep k\nObservation: " and the answer cue, around the observation

TOOLS = (
    ("lookup_manifest", "Return the cargo manifest of one ship's call at the port: every consignment with its "
     "crates, weight and consignee.", (("ship", "string", "the ship's registered name"),
                                      ("day", "integer", "day of the month of the call, 1-28"),
                                      ("month", "integer", "month of the call, 1-12"))),
    ("berth_schedule", "List the berths booked on a day, with the ship, the expected arrival and departure hour "
     "and the pilot assigned.", (("day", "integer", "day of the month, 1-28"),
                                 ("month", "integer", "month, 1-12"),
                                 ("quay", "string", "north, south or river quay; all quays when absent"))),
    ("weather_log", "Read the harbour master's weather log for a day: wind direction and force, visibility, sea "
     "state and any storm warning in force.", (("day", "integer", "day of the month, 1-28"),
                                               ("month", "integer", "month, 1-12"))),
    ("crew_roster", "Return the crew list a ship declared on arrival, with each sailor's rank and the port they "
     "signed on at.", (("ship", "string", "the ship's registered name"),
                       ("voyage", "string", "the voyage number printed on the manifest"))),
    ("customs_ledger", "Search the customs ledger for duties charged on a kind of cargo between two dates; "
     "returns one line per consignment with the duty paid.", (("cargo", "string", "the kind of cargo, e.g. salt"),
                                                               ("from_day", "integer", "first day, 1-28"),
                                                               ("to_day", "integer", "last day, 1-28"),
                                                               ("month", "integer", "month, 1-12"))),
    ("warehouse_stock", "Count what a warehouse holds now: crates per kind of cargo, the shelf they are on and "
     "the date each lot came in.", (("warehouse", "string", "warehouse letter, A to H"),
                                    ("cargo", "string", "one kind of cargo; every kind when absent"))),
    ("send_message", "Send a short message to a ship's captain, the harbour master or a consignee. The message "
     "is logged and cannot be recalled.", (("to", "string", "the recipient's name or office"),
                                           ("text", "string", "the message, at most 400 characters"))),
    ("tide_table", "Return the high and low water times and heights for a day, from the almanac of the river "
     "port of Vell.", (("day", "integer", "day of the month, 1-28"), ("month", "integer", "month, 1-12"))),
    ("pilot_roster", "List the pilots on duty for a watch, with the ships each has brought in and out this "
     "month.", (("watch", "string", "morning, afternoon or night"),
                ("day", "integer", "day of the month, 1-28"))),
    ("invoice_draft", "Draft a harbour dues invoice for a ship's call; returns the draft for review, nothing is "
     "sent.", (("ship", "string", "the ship's registered name"),
               ("berth_hours", "integer", "hours at the berth, rounded up"),
               ("pilotage", "boolean", "whether a pilot was used"))),
    ("incident_report", "File an incident report: damage, a spill, an injury or a delay. Returns the report "
     "number.", (("kind", "string", "damage, spill, injury or delay"),
                 ("ship", "string", "the ship involved, if any"),
                 ("summary", "string", "what happened, at most 600 characters"))),
    ("calculator", "Evaluate an arithmetic expression with + - * / and parentheses; returns the number.",
     (("expression", "string", "the expression, e.g. (41 + 17) * 3"),)),
)

RULES = (
    "Think before every action: write one short thought, then exactly one tool call as a JSON object on its "
    "own line, for example {\"tool\": \"weather_log\", \"arguments\": {\"day\": 12, \"month\": 3}}.",
    "Never invent a manifest, a berth or a number: look it up with a tool and quote the tool's answer.",
    "When two records disagree, trust the customs ledger over a manifest, and a manifest over a message.",
    "Dates are day and month of the current year; the port works in local time; hours are 0-23.",
    "A message to a captain must be polite, name the ship and the berth, and be shorter than 400 characters.",
    "Ask the harbour master before moving a ship that carries lamp oil or any cargo marked hazardous.",
    "When the task is done, write FINAL: and the answer in one paragraph, with the records you relied on.",
    "If a tool fails, read its error, correct the arguments once and retry; after two failures, report it.",
)

SHIPS = ("Heron", "Marigold", "North Star", "Patience", "Kestrel", "Old Grey", "Swift", "Juniper", "Albatross",
         "Wren", "Saltmarsh", "Bright Morning")
CARGO = ("salt", "timber", "wool", "copper", "grain", "lamp oil", "rope", "tea", "iron nails", "dried fish",
         "slate", "linen")
NAMES = ("Mara", "Tomas", "Ines", "Oskar", "Lena", "Farid", "Greta", "Yusuf", "Alba", "Niko", "Sunniva", "Ravi")
QUAYS = ("north", "south", "river")
WIND = ("north", "north-east", "east", "south-east", "south", "south-west", "west", "north-west")


def _tool_block(name: str, description: str, params: tuple) -> str:
    lines = [f"### {name}", description, "Parameters:"]
    lines += [f"- {p} ({t}): {d}" for p, t, d in params]
    required = ", ".join(p for p, _, d in params if "when absent" not in d and "if any" not in d)
    lines.append(f"Required: {required}.")
    return "\n".join(lines) + "\n"


def _note(rng: random.Random) -> str:
    return (f"- Standing order {rng.randint(100, 999)}: the {rng.choice(SHIPS)} berths at the "
            f"{rng.choice(QUAYS)} quay on day {rng.randint(1, 28)} of month {rng.randint(1, 12)}; its "
            f"{rng.choice(CARGO)} goes to warehouse {rng.choice('ABCDEFGH')} and captain {rng.choice(NAMES)} "
            f"reports to the harbour master at {rng.randint(6, 20)}:00.\n")


def preamble(rng: random.Random, tokens: int = 1500) -> str:
    """About ``tokens`` tokens (estimated at ``PREAMBLE_CHARS_PER_TOKEN`` characters per token) of agent
    instructions: a first line unique to ``rng`` (a deployment number), the rules, the twelve tool
    definitions in an order drawn from ``rng``, then standing orders until the size is reached. Ends with a
    newline. Deterministic: the same ``rng`` state gives the same text."""
    deployment = rng.randrange(10**8)
    tools = list(TOOLS)
    rng.shuffle(tools)
    parts = [f"Port authority operations agent, deployment {deployment:08d}.\n\n"
             "You are the operations agent of the river port of Vell. You answer the harbour master's tasks "
             "by calling tools; you never guess a record you can look up.\n\n## Rules\n"]
    parts += [f"{i + 1}. {r}\n" for i, r in enumerate(RULES)]
    parts.append("\n## Tools\nCall a tool by writing one JSON object on its own line: {\"tool\": NAME, "
                 "\"arguments\": {...}}. The tool's answer comes back as an Observation.\n\n")
    parts += [_tool_block(*t) + "\n" for t in tools]
    parts.append("## Standing orders\n")
    size = sum(len(p) for p in parts)
    target = tokens * PREAMBLE_CHARS_PER_TOKEN
    while size < target:
        n = _note(rng)
        parts.append(n)
        size += len(n)
    return "".join(parts)


def task(rng: random.Random) -> str:
    """One task for the agent (one or two sentences naming a ship, a day and a cargo)."""
    ship, cargo, day, month = rng.choice(SHIPS), rng.choice(CARGO), rng.randint(1, 28), rng.randint(1, 12)
    return rng.choice((
        f"The {ship} is due on day {day} of month {month} with {cargo}. Find a free berth, check the weather "
        f"and the tide, and tell her captain where and when to come in.",
        f"Customs says the duty on the {cargo} landed by the {ship} on day {day} of month {month} was never "
        f"paid. Check the ledger against the manifest and draft the invoice.",
        f"Warehouse {rng.choice('ABCDEFGH')} reports fewer crates of {cargo} than the {ship} declared on day "
        f"{day} of month {month}. Find where the difference went and file a report if needed.",
        f"A pilot is needed for the {ship} leaving on day {day} of month {month}; her {cargo} is hazardous. "
        f"Find who is on duty, ask the harbour master and message the captain."))


def _record(rng: random.Random) -> str:
    fields = [f'"ship": "{rng.choice(SHIPS)}"', f'"day": {rng.randint(1, 28)}', f'"month": {rng.randint(1, 12)}',
              f'"quay": "{rng.choice(QUAYS)}"', f'"cargo": "{rng.choice(CARGO)}"', f'"crates": {rng.randint(2, 90)}',
              f'"weight_kg": {rng.randint(80, 4000)}', f'"captain": "{rng.choice(NAMES)}"',
              f'"wind": "{rng.choice(WIND)} {rng.randint(1, 9)}"']
    return "{" + ", ".join(fields[:2] + rng.sample(fields[2:], 2)) + "}"


def observation(rng: random.Random, tokens: int) -> str:
    """A tool's answer of about ``tokens`` tokens (estimated at ``STEP_CHARS_PER_TOKEN``; one record is about
    25 tokens, so within about 13 of it): a tool name and JSON records, one per line."""
    name = rng.choice(TOOLS)[0]
    lines = [f'{{"tool": "{name}", "status": "ok", "records": [']
    size, target = len(lines[0]) + 3, tokens * STEP_CHARS_PER_TOKEN
    while True:  # records while the next one ends nearer the target than without it (at least one)
        r = "  " + _record(rng) + ","
        if len(lines) > 1 and size + len(r) / 2 > target:
            break
        lines.append(r)
        size += len(r) + 1
    lines[-1] = lines[-1].rstrip(",")
    lines.append("]}")
    return "\n".join(lines)


@dataclass
class Session:
    """One agent session: the shared ``preamble``, its ``header`` (session id and task) and the text each
    step adds before its answer (``steps[k]``: the step's number, the observation and the answer cue), with
    the ``answers`` received so far (the server's own, appended verbatim)."""

    preamble: str
    header: str
    steps: list[str]
    answers: list[str] = field(default_factory=list)

    def prompt(self, k: int) -> str:
        """The prompt of step ``k`` (0-based): preamble + header + steps 0..k-1 each followed by its answer +
        step ``k``. Raises ``ValueError`` when an earlier step's answer is missing."""
        if k > len(self.answers):
            raise ValueError(f"step {k} needs the answers of steps 0..{k - 1}; have {len(self.answers)}")
        done = "".join(s + a for s, a in zip(self.steps[:k], self.answers[:k]))
        return self.preamble + self.header + done + self.steps[k]


def plan_session(rng: random.Random, preamble_text: str, steps: int, step_tokens: int = 260,
                 answer_tokens: int = 64, name: str = "A") -> Session:
    """A session of ``steps`` steps over ``preamble_text``: a task (``task(rng)``), then per step its frame
    and an observation of about ``step_tokens - answer_tokens - STEP_FRAME_TOKENS`` tokens (at least 32), so
    that with an answer of ``answer_tokens`` tokens each step adds about ``step_tokens`` tokens to the
    prompt."""
    header = f"\n=== Session {name}-{rng.randrange(10**6):06d} ===\nTask: {task(rng)}\n"
    obs = max(32, step_tokens - answer_tokens - STEP_FRAME_TOKENS)
    texts = [f"\nStep {k + 1}\nObservation: {observation(rng, obs)}{ANSWER_CUE}" for k in range(steps)]
    return Session(preamble_text, header, texts)


def approx_tokens(text: str, chars_per_token: float) -> float:
    """``len(text) / chars_per_token``: a size estimate in tokens."""
    return len(text) / chars_per_token


# -- the phases -----------------------------------------------------------------------------------------------
@dataclass
class AgentPlan:
    """Everything one round of the agent workload sends, fixed before any target runs (both targets get
    the same text; each continues a session with its own answers)."""

    preamble: str
    first: Session   # (a), continued in (c)
    second: Session  # (b)
    long_prompt: str  # (d)
    more_steps: int


def make_plan(rng: random.Random, cfg: Any, long_prompt: Callable[[random.Random, int], str]) -> AgentPlan:
    """The round's text: preamble, session A (``agent_steps`` + ``agent_more_steps`` steps planned), session B
    (``agent_steps``), and a long prompt of about ``long_tokens`` tokens."""
    pre = preamble(rng, cfg.agent_preamble_tokens)
    a = plan_session(rng, pre, cfg.agent_steps + cfg.agent_more_steps, cfg.agent_step_tokens,
                     cfg.agent_max_tokens, "A")
    b = plan_session(rng, pre, cfg.agent_steps, cfg.agent_step_tokens, cfg.agent_max_tokens, "B")
    return AgentPlan(pre, a, b, long_prompt(rng, cfg.long_tokens), cfg.agent_more_steps)


def fresh(session: Session) -> Session:
    """A copy of ``session`` without answers (each target writes its own)."""
    return Session(session.preamble, session.header, list(session.steps))


@dataclass
class Phase:
    """One measured phase: its ``seconds`` (None when a request failed), the records' indices, and notes."""

    name: str
    seconds: Optional[float]
    requests: list[int]
    info: dict[str, Any] = field(default_factory=dict)


def run_phases(plan: AgentPlan, steps: int, send: Callable[[str, str], Any], restart: Callable[[], dict],
               warm_up: Callable[[], None], settle_s: float) -> tuple[list[Any], dict[str, Any]]:
    """Run the agent phases on one target and return ``(records, extra)``.

    ``send(prompt, kind)`` streams one greedy request and returns its ``RequestRecord``; ``restart()`` stops
    the target's server process and starts a new one with the same data folder, returning its timings
    (``started_s``: ``perf_counter`` just before the new process was spawned, ``ready_s``: its health check
    first answered 200); ``warm_up()`` sends the benchmark's unmeasured 4-token request. ``settle_s`` seconds
    pass before each restart (outside every clock), as a person does not restart a server within a millisecond
    of an answer. Phases (seconds, all ``perf_counter`` in the client):

    - ``session``: (a) ``steps`` steps of session A in the running process; first step sent → last step's
      stream ended;
    - ``new_session_after_restart``: restart, warm-up, then (b) ``steps`` steps of session B (same preamble,
      another task); first step sent → last step ended;
    - ``session_continued_after_restart``: restart, warm-up, then (c) ``plan.more_steps`` more steps of
      session A; first sent → last ended;
    - ``start_to_first_token``: the long prompt is sent once (its record kept, ``long_seen``), restart, and
      (d) the same prompt sent as soon as the health check answers: new process spawned → its first token
      received (``info``: spawn → ready, and the request's TTFT).

    A failed request ends the phase (its seconds None) and the phases that need its answer."""
    records: list[Any] = []
    extra: dict[str, Any] = {"phases": {}, "restarts": []}

    def step(session: Session, k: int, kind: str) -> Optional[Any]:
        rec = send(session.prompt(k), kind)
        records.append(rec)
        if rec.status != "ok":
            return None
        session.answers.append(rec.text)
        return rec

    def session_phase(name: str, session: Session, ks: range, kind: str) -> bool:
        first = len(records)
        t0 = time.perf_counter()
        ok = all(step(session, k, kind) is not None for k in ks)
        seconds = (records[-1].end_s - records[first].send_s) if ok else None
        wall = time.perf_counter() - t0
        extra["phases"][name] = Phase(name, seconds, list(range(first, len(records))),
                                      {"steps": len(ks), "wall_s": wall,
                                       "prompt_tokens": [r.prompt_tokens for r in records[first:]],
                                       "cached_tokens": [r.cached_tokens for r in records[first:]]}).__dict__
        return ok

    def do_restart(why: str) -> dict:
        time.sleep(settle_s)
        t = restart()
        t["before"] = why
        extra["restarts"].append(t)
        return t

    a, b = fresh(plan.first), fresh(plan.second)
    ok_a = session_phase("session", a, range(steps), "agent-a")
    do_restart("new_session_after_restart")
    warm_up()
    session_phase("new_session_after_restart", b, range(steps), "agent-b")
    if ok_a:
        do_restart("session_continued_after_restart")
        warm_up()
        session_phase("session_continued_after_restart", a, range(steps, steps + plan.more_steps), "agent-a")
    else:
        extra["phases"]["session_continued_after_restart"] = Phase("session_continued_after_restart", None, [],
                                                                   {"skipped": "session A failed"}).__dict__
    seen = send(plan.long_prompt, "agent-long-seen")
    records.append(seen)
    extra["long_seen"] = len(records) - 1
    t = do_restart("start_to_first_token")
    rec = send(plan.long_prompt, "agent-long-after-restart")
    records.append(rec)
    ok = rec.status == "ok" and rec.first_token_s is not None
    extra["phases"]["start_to_first_token"] = Phase(
        "start_to_first_token", (rec.first_token_s - t["started_s"]) if ok else None, [len(records) - 1],
        {"spawn_to_ready_s": t["ready_s"] - t["started_s"], "ready_to_send_s": rec.send_s - t["ready_s"],
         "ttft_s": rec.ttft_s, "prompt_tokens": rec.prompt_tokens, "cached_tokens": rec.cached_tokens,
         "long_seen_ok": seen.status == "ok"}).__dict__
    for r in extra["restarts"]:  # perf_counter stamps mean nothing outside this run: keep durations only
        r["spawn_to_ready_s"] = r.pop("ready_s") - r.pop("started_s")
    return records, extra
