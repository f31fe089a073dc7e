"""The simulated users' conversations: most share one system prompt (so their first blocks are shared
and cached), a few have their own; prompt and reply lengths vary, so memory fills unevenly."""

SHARED_SYSTEM = (
    "You are a friendly tutor in a computer science class. Explain ideas with one concrete everyday example, "
    "use plain words, and keep every answer short enough to read aloud in under a minute. If a question is "
    "ambiguous, pick the most common meaning and say which one you picked."
)

PRESETS: list[dict] = [
    {"name": "Ada", "messages": [{"role": "system", "content": SHARED_SYSTEM},
                                 {"role": "user", "content": "What is a cache?"}]},
    {"name": "Grace", "messages": [{"role": "system", "content": SHARED_SYSTEM},
                                   {"role": "user", "content": "Why do computers use binary numbers instead of decimal ones?"}]},
    {"name": "Alan", "messages": [{"role": "user", "content": "Write a haiku about memory pages."}]},
    {"name": "Edsger", "messages": [{"role": "system", "content": SHARED_SYSTEM},
                                    {"role": "user", "content": "Explain recursion."},
                                    {"role": "assistant", "content": "Recursion is when a function solves a problem by calling itself on a smaller piece of the same problem."},
                                    {"role": "user", "content": "Give me a real-world example of that."}]},
    {"name": "Barbara", "messages": [{"role": "system", "content": SHARED_SYSTEM},
                                     {"role": "user", "content": "What does an operating system do?"}]},
    {"name": "Donald", "messages": [{"role": "system", "content": "You are a poet. Answer only in rhyming couplets."},
                                    {"role": "user", "content": "Describe a sorting algorithm."}]},
    {"name": "Margaret", "messages": [{"role": "system", "content": SHARED_SYSTEM},
                                      {"role": "user", "content": "How did software get people to the moon? Keep it to the main ideas, "
                                       "and mention why testing mattered so much when nobody could fix a bug in flight."}]},
    {"name": "Linus", "messages": [{"role": "user", "content": "In two sentences, what is version control?"}]},
    {"name": "Radia", "messages": [{"role": "system", "content": SHARED_SYSTEM},
                                   {"role": "user", "content": "How do computers on a network avoid sending data in circles?"}]},
    {"name": "Ken", "messages": [{"role": "system", "content": SHARED_SYSTEM},
                                 {"role": "user", "content": "What is a pipe in a Unix shell?"}]},
    {"name": "Frances", "messages": [{"role": "system", "content": SHARED_SYSTEM},
                                     {"role": "user", "content": "What does a compiler do, step by step?"}]},
    {"name": "John", "messages": [{"role": "user", "content": "Tell me a very short story about a robot who learns to count."}]},
]


def preset(i: int) -> dict:
    """The i-th simulated user's preset; they repeat with a numbered name past the list's end."""
    base = PRESETS[i % len(PRESETS)]
    rounds = i // len(PRESETS)
    return {"name": base["name"] + (f" {rounds + 1}" if rounds else ""), "messages": base["messages"]}
