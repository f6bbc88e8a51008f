"""Arithmetic word problems with known answers for ``hearth bench reasoning`` (issue 14).

``generate_items(count, seed)`` builds ``count`` two-step problems ("Mara has 3 boxes of 4 apples and eats 2.
How many apples are left?") from ten templates, taken in turn, with operands, names and objects drawn from
``random.Random(seed)``: the same arguments give the same items on every machine and Python version
(``random.Random`` with an int seed and ``randint`` / ``choice`` are reproducible across versions). Every
answer is a positive integer below 100 and every operand a small number, so that a 270M
model solves some and misses some: the set measures what extra samples and extra thinking earn, not a
ceiling. ``default_items()`` is the default set: 60 items, seed 14.

Prompts follow the few-shot format a base model continues (``FEW_SHOT``): three worked examples written for
this file (not drawn from the generator), then ``Q: <question>\\nA:``; the model is expected to end with
"The answer is N." and stop at ``STOP``. Answers are read with the ``last_number`` extractor
(``EXTRACT``), since the answer sentence is the last thing before the stop; ``VERIFIER`` accepts a bare
non-negative integer, a cheap format check (correctness is judged against ``Item.answer``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

FEW_SHOT = (
    "Q: Lena has 2 bags of 5 oranges and gives away 3. How many oranges does she have left?\n"
    "A: 2 bags of 5 oranges is 2 * 5 = 10 oranges. 10 - 3 = 7. The answer is 7.\n\n"
    "Q: A shop has 12 cups. It gets 3 boxes with 4 cups in each box. How many cups does the shop have now?\n"
    "A: 3 boxes of 4 cups is 3 * 4 = 12 cups. 12 + 12 = 24. The answer is 24.\n\n"
    "Q: Omar splits 18 grapes equally among 3 bowls and then adds 2 grapes to each bowl. "
    "How many grapes are in each bowl?\n"
    "A: 18 grapes in 3 bowls is 18 / 3 = 6 grapes. 6 + 2 = 8. The answer is 8.\n\n"
)
STOP = ("\nQ:", "\n\n")
EXTRACT = "last_number"
VERIFIER = {"regex": "[0-9]+"}

NAMES = (("Mara", "she"), ("Tom", "he"), ("Ines", "she"), ("Kofi", "he"), ("Aiko", "she"), ("Ravi", "he"),
         ("Noor", "she"), ("Lukas", "he"), ("Sofia", "she"), ("Diego", "he"), ("Hana", "she"), ("Yusuf", "he"))
FRUITS = ("apples", "pears", "plums", "lemons", "peaches", "mangoes")
THINGS = ("stickers", "marbles", "cards", "shells", "stamps", "beads")


@dataclass(frozen=True)
class Item:
    """One problem. ``id``: ``"arith-000"``…; ``kind``: its template; ``operands``: the numbers in the order
    they appear in ``question``; ``answer``: the known answer (an int, 1..99)."""

    id: str
    kind: str
    question: str
    operands: tuple[int, ...]
    answer: int

    def prompt(self) -> str:
        """The few-shot prompt for a completion: ``FEW_SHOT`` + ``Q: <question>\\nA:``."""
        return f"{FEW_SHOT}Q: {self.question}\nA:"


def _boxes_eat(r: random.Random, name: str, pron: str) -> tuple[str, tuple[int, ...], int]:
    a, b, fruit = r.randint(2, 6), r.randint(2, 9), r.choice(FRUITS)
    c = r.randint(1, min(9, a * b - 1))
    return f"{name} has {a} boxes of {b} {fruit} and eats {c}. How many {fruit} are left?", (a, b, c), a * b - c


def _buy_bags(r: random.Random, name: str, pron: str) -> tuple[str, tuple[int, ...], int]:
    a, b, c, thing = r.randint(2, 20), r.randint(2, 5), r.randint(2, 9), r.choice(THINGS)
    return (f"{name} has {a} {thing} and buys {b} bags with {c} {thing} in each bag. "
            f"How many {thing} does {pron} have now?"), (a, b, c), a + b * c


def _give_friends(r: random.Random, name: str, pron: str) -> tuple[str, tuple[int, ...], int]:
    b, c, thing = r.randint(2, 5), r.randint(2, 5), r.choice(THINGS)
    a = b * c + r.randint(1, 15)
    return (f"{name} has {a} {thing} and gives {b} {thing} to each of {c} friends. "
            f"How many {thing} are left?"), (a, b, c), a - b * c


def _pages(r: random.Random, name: str, pron: str) -> tuple[str, tuple[int, ...], int]:
    a, b, c = r.randint(2, 12), r.randint(2, 7), r.randint(2, 9)
    return (f"{name} reads {a} pages every day for {b} days and then reads {c} more pages. "
            f"How many pages does {pron} read in all?"), (a, b, c), a * b + c


def _share(r: random.Random, name: str, pron: str) -> tuple[str, tuple[int, ...], int]:
    b, q, c = r.randint(2, 6), r.randint(2, 9), r.randint(1, 5)
    return (f"{name} shares {b * q} cookies equally among {b} friends and then gives each friend {c} more. "
            "How many cookies does each friend have?"), (b * q, b, c), q + c


def _wages(r: random.Random, name: str, pron: str) -> tuple[str, tuple[int, ...], int]:
    a, b = r.randint(3, 12), r.randint(2, 6)
    c = r.randint(2, min(20, a * b - 1))
    return (f"{name} earns {a} dollars a day for {b} days and spends {c} dollars. "
            "How many dollars are left?"), (a, b, c), a * b - c


def _bag(r: random.Random, name: str, pron: str) -> tuple[str, tuple[int, ...], int]:
    a, b = r.randint(2, 15), r.randint(2, 15)
    c = r.randint(2, min(10, a + b - 1))
    return (f"A bag has {a} red marbles and {b} blue marbles. {name} takes out {c} marbles. "
            "How many marbles are still in the bag?"), (a, b, c), a + b - c


def _change(r: random.Random, name: str, pron: str) -> tuple[str, tuple[int, ...], int]:
    a, b = r.randint(2, 5), r.randint(2, 5)
    c = r.choice([x for x in (10, 20, 50) if x > a * b])
    return (f"{name} buys {a} pencils that cost {b} dollars each and pays with a {c} dollar bill. "
            f"How many dollars of change does {pron} get?"), (a, b, c), c - a * b


def _seats(r: random.Random, name: str, pron: str) -> tuple[str, tuple[int, ...], int]:
    a, b = r.randint(3, 10), r.randint(2, 4)
    c = r.randint(2, min(9, a * b - 1))
    return (f"A bus has {a} rows with {b} seats in each row. {c} seats are empty. "
            "How many people are sitting on the bus?"), (a, b, c), a * b - c


def _legs(r: random.Random, name: str, pron: str) -> tuple[str, tuple[int, ...], int]:
    a, b = r.randint(2, 9), r.randint(2, 9)
    return (f"{name} has a farm with {a} chickens and {b} cows. Chickens have 2 legs and cows have 4 legs. "
            "How many legs are there in all?"), (a, b, 2, 4), 2 * a + 4 * b


KINDS: dict[str, Callable[[random.Random, str, str], tuple[str, tuple[int, ...], int]]] = {
    "boxes_eat": _boxes_eat, "buy_bags": _buy_bags, "give_friends": _give_friends, "pages": _pages,
    "share": _share, "wages": _wages, "bag": _bag, "change": _change, "seats": _seats, "legs": _legs}


def generate_items(count: int = 60, seed: int = 14) -> list[Item]:
    """``count`` distinct items, the templates of ``KINDS`` in turn, drawn from ``random.Random(seed)``.
    Raises ``ValueError`` for ``count`` < 1 or when that many distinct questions cannot be drawn."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    r = random.Random(seed)
    kinds = list(KINDS.items())
    items: list[Item] = []
    seen: set[str] = set()
    for attempt in range(count * 50):
        kind, make = kinds[len(items) % len(kinds)]
        name, pron = r.choice(NAMES)
        question, operands, answer = make(r, name, pron)
        if question not in seen:
            seen.add(question)
            items.append(Item(f"arith-{len(items):03d}", kind, question, operands, answer))
            if len(items) == count:
                return items
    raise ValueError(f"could not draw {count} distinct questions")


@lru_cache(maxsize=1)
def default_items() -> tuple[Item, ...]:
    """The default set: ``generate_items(60, 14)``, built on first use."""
    return tuple(generate_items(60, 14))
