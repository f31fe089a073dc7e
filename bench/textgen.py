"""Real-ish English for benchmark prompts, from a seeded generator.

The benchmark must not download a dataset, yet prompts of random token ids would make tokenisation, the chat
template and stop behaviour unrealistic. So user messages are composed from a small grammar of questions and
context sentences: the same seed always gives the same text, and the text reads like a chat request.
"""

from __future__ import annotations

import random

_TOPICS = [
    "sourdough bread", "the French revolution", "black holes", "container shipping", "honey bees",
    "the Python GIL", "urban gardening", "marathon training", "jazz harmony", "solar panels",
    "medieval castles", "coral reefs", "compound interest", "volcanoes", "the immune system",
    "chess openings", "electric cars", "ancient Rome", "machine translation", "coffee roasting",
    "plate tectonics", "public libraries", "bicycle maintenance", "the water cycle", "opera",
]
_ASKS = [
    "Can you explain {t} to me in simple terms?",
    "What are the most common mistakes people make with {t}?",
    "Write a short story that involves {t}.",
    "Give me three surprising facts about {t}.",
    "How would you teach {t} to a ten year old?",
    "Summarise the history of {t} in a few sentences.",
    "What should a beginner read first about {t}?",
    "Compare {t} with {u} and say which is harder to learn.",
]
_CONTEXT = [
    "I have been reading about {t} for a few weeks and I still feel confused.",
    "My friend says that {t} is overrated, but I am not so sure about that.",
    "Last year I tried to learn about {t} and gave up after a month.",
    "At work we are planning a small project that touches on {t} and {u}.",
    "I found an old book about {t} in my grandmother's attic yesterday.",
    "Our teacher asked us to prepare a presentation on {t} for next Monday.",
    "Some people online claim that {t} and {u} are closely related.",
    "I would like a clear answer, with examples, and without too much jargon.",
    "Please keep in mind that I already know the basics of {u}.",
    "The last explanation I got was far too long and skipped the important parts.",
]


def user_message(rng: random.Random, num_sentences: int) -> str:
    """A chat request: `num_sentences` - 1 sentences of context, then a question."""
    if num_sentences < 1:
        raise ValueError(f"num_sentences must be at least 1, got {num_sentences}")
    topic, other = rng.sample(_TOPICS, 2)
    context = [rng.choice(_CONTEXT).format(t=topic, u=other) for _ in range(num_sentences - 1)]
    return " ".join(context + [rng.choice(_ASKS).format(t=topic, u=other)])


def system_prompt(rng: random.Random, num_sentences: int) -> str:
    """A long shared system prompt (house rules for an assistant), as playground deployments use."""
    rules = [
        "You are a patient and friendly assistant for a public library.",
        "Always answer in plain English and define any technical term you use.",
        "When a question is ambiguous, state the interpretation you chose before answering.",
        "Prefer short paragraphs and concrete examples over long abstract explanations.",
        "Never invent book titles, authors or page numbers; say when you are unsure.",
        "If the visitor asks about {t}, suggest one introductory resource and one advanced one.",
        "Keep a calm tone even when the visitor is frustrated or impolite.",
        "Do not give medical, legal or financial advice; refer the visitor to a professional.",
        "End every answer with one follow-up question that helps the visitor learn more about {u}.",
    ]
    topic, other = rng.sample(_TOPICS, 2)
    return " ".join(rng.choice(rules).format(t=topic, u=other) for _ in range(num_sentences))
