"""The greedy-oracle prompts, importable by any test (a conftest is not a module to import from)."""

# Eight prompts of clearly different lengths (2 to ~150 tokens) for the greedy oracle.
ORACLE_PROMPTS = [
    "Hi",
    "The capital of France is",
    "Write a haiku about the sea.",
    "1, 2, 3, 4, 5,",
    "Explain in one sentence why the sky is blue to a curious child who keeps asking questions.",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a land far away, there lived a king who had three daughters. The eldest was "
    "proud, the second was clever, and the youngest was kind. One day a stranger came to the castle and",
    " ".join(f"Item {i}: a line of a long shopping list with apples, pears and bread." for i in range(10)),
]
