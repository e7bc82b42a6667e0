"""Deterministic synthetic SFT conversations for the demo and the tests (no downloads)."""

from __future__ import annotations

import random

SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are a concise assistant. Answer briefly.",
    "You are a patient math tutor.",
    "",
]

PLANETS = {
    "Mercury": (0.39, 0), "Venus": (0.72, 0), "Earth": (1.0, 1), "Mars": (1.52, 2),
    "Jupiter": (5.2, 95), "Saturn": (9.5, 146), "Uranus": (19.2, 28), "Neptune": (30.1, 16),
}

WORDS = ["river", "lantern", "orbit", "copper", "meadow", "signal", "harbor", "puzzle", "glacier",
         "violet", "compass", "thunder", "pepper", "marble", "canyon", "falcon", "ribbon", "summit"]


def _arithmetic(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(2, 999), rng.randint(2, 999)
    op = rng.choice(["+", "-", "*"])
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    return f"What is {a} {op} {b}?", f"{a} {op} {b} = {value}."


def _planet(rng: random.Random) -> tuple[str, str]:
    name = rng.choice(sorted(PLANETS))
    au, moons = PLANETS[name]
    return (f"Tell me about {name}.",
            f"{name} orbits the Sun at about {au} astronomical units and has {moons} known "
            f"moon{'s' if moons != 1 else ''}.")


def _spell(rng: random.Random) -> tuple[str, str]:
    word = rng.choice(WORDS)
    return f"Spell the word '{word}' letter by letter.", " ".join(word.upper())


def _count(rng: random.Random) -> tuple[str, str]:
    start = rng.randint(1, 50)
    stop = start + rng.randint(5, 120)
    return (f"Count from {start} to {stop}, separated by commas.",
            ", ".join(str(i) for i in range(start, stop + 1)) + ".")


def _story(rng: random.Random) -> tuple[str, str]:
    words = rng.sample(WORDS, 3)
    n = rng.randint(2, 14)
    sentences = []
    for i in range(n):
        w = words[i % 3]
        sentences.append(rng.choice([
            f"The {w} was quiet in the morning light.",
            f"Someone had left a {w} near the old gate.",
            f"Nobody could explain why the {w} kept changing colour.",
            f"By evening the {w} had become the talk of the village.",
        ]))
    return f"Write a short story using the words {', '.join(words)}.", " ".join(sentences)


TOPICS = [_arithmetic, _planet, _spell, _count, _story]


def make_conversation(rng: random.Random) -> list[dict]:
    """One conversation: an optional system prompt, then 1-4 user/assistant exchanges."""
    messages = []
    system = rng.choice(SYSTEM_PROMPTS)
    if rng.random() < 0.8:
        messages.append({"role": "system", "content": system})
    for _ in range(rng.choice([1, 1, 1, 2, 2, 3, 4])):
        question, answer = rng.choice(TOPICS)(rng)
        messages.append({"role": "user", "content": question + "\n"})
        messages.append({"role": "assistant", "content": answer + "\n"})
    return messages


def make_conversations(n: int, seed: int = 0) -> list[list[dict]]:
    """``n`` deterministic conversations."""
    rng = random.Random(seed)
    return [make_conversation(rng) for _ in range(n)]
