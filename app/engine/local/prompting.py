"""The runtime's vocabulary and prompts: tokens, the template's rendering and thinking plan, the turn breaks of
the canonical prefill layout. Served on the child's side lane too (they only read the vocabulary and template)."""

from __future__ import annotations

import os
from dataclasses import replace

from app.engine.chat.reasoning_budget import plan_prompt, render_kwargs
from app.engine.chat.templates import RenderedPrompt, render
from app.engine.local.layout import answer_end_token, layout_bounds, turn_break_token
from app.errors import InvalidRequest
from app.protocol.reasoning import ReasoningBudget
from app.protocol.types import ChatMessage, GenerateRequest


class PromptMixin:
    """``Runtime``'s tokens and prompts (it holds ``llm``, ``_lib``, ``vocab``, ``n_vocab``, ``markers`` ...)."""

    def _piece(self, token: int, special: bool = False) -> str:
        return self.llm._model.detokenize([token], special=special).decode("utf-8", errors="replace")

    def _turn_breaks(self) -> frozenset[int]:
        """The prefill layout's turn breaks: the assistant turn's opening token (``layout.turn_break_token`` on
        two one-message prompts of the model's template) and, when that token does not also open the user's
        turn, the token that follows an answer (``layout.answer_end_token`` on a user-answer-user chat: the
        transcript's ``User``). Empty when the template has none or does not render."""
        lib, vocab = self._lib, self.llm._model.vocab

        def is_control(t: int) -> bool:
            return bool(lib.llama_vocab_is_control(vocab, t))

        def is_blank(t: int) -> bool:
            return not self._piece(t, special=True).strip()

        try:
            a, b = (self.render(GenerateRequest(messages=(ChatMessage("user", text),)))
                    for text in ("Hello there.", "What is the capital of France?"))
            ta = self.tokenize(a.text, add_bos=a.add_bos, special=True)
            tb = self.tokenize(b.text, add_bos=b.add_bos, special=True)
            found = turn_break_token(ta, tb, is_control, is_blank)
        except Exception:  # noqa: BLE001 - a template that cannot render a plain message: no breaks
            return frozenset()
        if found is None:
            return frozenset()
        try:
            answer, then = "Sure, it is Paris.", "Thanks a lot."
            chat = self.render(GenerateRequest(messages=(ChatMessage("user", "Hello there."),
                                                         ChatMessage("assistant", answer),
                                                         ChatMessage("user", then))))
            full = self.tokenize(chat.text, add_bos=chat.add_bos, special=True)
            at = chat.text.index(answer) + len(answer)
            starts = chat.text.rindex(then)
            end = self._prefix_len(full, chat.text[:at], chat.add_bos)
            start = self._prefix_len(full, chat.text[:starts], chat.add_bos)
            closer = answer_end_token(full, end, start, {found}, is_control, is_blank)
        except Exception:  # noqa: BLE001 - no multi-turn rendering: the assistant break alone
            closer = None
        return frozenset({found} if closer is None else {found, closer})

    def _prefix_len(self, full: list[int], text: str, add_bos: bool) -> int:
        """How many of ``full``'s tokens ``text`` (a prefix of the text ``full`` was tokenized from) covers:
        its own token count, one less when the tokenizer merged its last token with what follows."""
        part = self.tokenize(text, add_bos=add_bos, special=True)
        n = len(part)
        return n if full[:n] == part else max(0, n - 1)

    def layout(self, tokens: list[int]) -> list[int]:
        """Where the canonical chunks of ``tokens`` end (``layout.layout_bounds`` with ``n_batch`` and this
        model's turn break)."""
        return layout_bounds(tokens, self.settings.n_batch, self.turn_breaks)

    def tokenize(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)

    def detokenize(self, tokens: list[int]) -> str:
        self._check_ids(tokens)
        return self.llm.detokenize(tokens).decode("utf-8", errors="replace")

    def _check_ids(self, tokens: list[int]) -> None:
        """llama.cpp aborts on a token id outside the vocabulary: refuse it first."""
        bad = [t for t in tokens if not 0 <= t < self.n_vocab]
        if bad:
            raise InvalidRequest(f"token id {bad[0]} is outside the vocabulary (0..{self.n_vocab - 1})",
                                 param="tokens")

    def piece_bytes(self, token: int, size: int = 64) -> bytes:
        """The exact bytes of one token's text (``llama_token_to_piece``, control tokens as ``b""``), whatever
        its length (llama-cpp-python's own ``detokenize`` assumes at most 32 bytes)."""
        import ctypes

        self._check_ids([token])
        buf = ctypes.create_string_buffer(size)
        n = self._lib.llama_token_to_piece(self.vocab, token, buf, size, 0, False)
        if n < 0:
            return self.piece_bytes(token, -n)
        return buf.raw[:n]

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (<eos>, <end_of_turn>, <|eot_id|>…); called once per token."""
        return bool(self._vocab_is_eog(self.vocab, token))

    def render(self, request: GenerateRequest) -> RenderedPrompt:
        """The prompt text of ``request`` (a raw prompt as given; messages through the template, with the
        thinking switch of ``reasoning_budget.render_kwargs`` for the request's budget)."""
        if request.prompt is not None:
            return RenderedPrompt(request.prompt, "none", request.add_bos, ())
        name = request.template or self.template_name
        budget = request.reasoning.budget if request.reasoning is not None else ReasoningBudget()
        return render(request.messages, name, chat_template=self.chat_template, bos_token=self.bos_text,
                      eos_token=self.eos_text, tools=request.tools, tool_choice=request.tool_choice,
                      parallel_tool_calls=request.parallel_tool_calls, architecture=self.architecture,
                      template_vars=render_kwargs(self.markers, self._budget(request, budget)),
                      answer_grammar=request.decoding.grammar)

    def _budget(self, request: GenerateRequest, budget: ReasoningBudget) -> ReasoningBudget:
        """A request decoding through a grammar (response_format, a forced tool call) does not think: the
        grammar would bind the thinking text too."""
        grammar = request.decoding.grammar or (request.tools and request.choice.forces_call)
        return replace(budget, tokens=0) if grammar else budget

    def thinking_plan(self, request: GenerateRequest, text: str):
        """``(suffix, budget, started_inside, thinks)`` for ``request``'s rendered prompt ``text``
        (``reasoning_budget.plan_prompt``); ``thinks``: the answer goes through a ``BudgetForcer`` (a model
        that thinks by itself, a budget asked of one that thinks when prefilled, or a prompt that ends inside
        thinking). A raw ``prompt`` thinks only when it ends inside thinking or a budget was asked."""
        budget = self._budget(request, request.reasoning.budget if request.reasoning is not None
                              else ReasoningBudget())
        if request.prompt is not None and not budget.asked and not self.markers.inside_after(text):
            return "", budget, False, False
        plan = plan_prompt(self.markers, text, budget)
        thinks = self.markers.native or plan.thinking or plan.started_inside
        return plan.suffix, budget, plan.started_inside, thinks

    def tools_tokens(self, request: GenerateRequest, prompt_tokens: int) -> int:
        """Tokens the tool definitions add to ``request``'s prompt of ``prompt_tokens`` tokens (its render
        without ``tools``, counted; 0 without tools)."""
        if not request.tools:
            return 0
        rp = self.render(replace(request, tools=(), tool_choice=None))
        return max(0, prompt_tokens - len(self.tokenize(rp.text, add_bos=rp.add_bos, special=True)))


class _MetaView:
    """Adapter giving ``choose_template_name`` the fields it reads from GGUF metadata."""

    def __init__(self, meta: dict, md: dict, path: str) -> None:
        self.chat_template = meta.get("chat_template", md.get("tokenizer.chat_template"))
        self.architecture = meta.get("architecture", md.get("general.architecture", ""))
        self.name = meta.get("name", md.get("general.name", ""))
        self.finetune = md.get("general.finetune", "")
        self.file_name = os.path.basename(path)
