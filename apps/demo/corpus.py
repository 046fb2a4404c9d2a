"""Text for the demo model: the tokenizer corpus, the training questions and the demo prompt set.

Pure data, no imports of torch. The demo prompt set is the documented contract of the demo
adapters: with greedy decoding, every prompt in ``DEMO_PROMPTS`` answered through an adapter
starts with that adapter's phrase, and the base model's answer contains none of the phrases.
Half of ``DEMO_PROMPTS`` never appear in training (``UNSEEN_PROMPTS``).
"""

from __future__ import annotations

import itertools
import random

BASE_MODEL_NAME = "lorahub-demo-tiny"
BASE_MODEL_REVISION = "r1"

# What each demo adapter has learned to say first. Distinct words, so one can never be mistaken
# for another in a test.
PHRASES: dict[str, str] = {
    "support-v1": "Thank you for contacting support.",
    "support-v2": "Hello from the helpdesk team!",
    "legal-v1": "This is not legal advice.",
}

SUBJECTS = [
    "my password",
    "my invoice",
    "the refund",
    "my order",
    "the delivery",
    "my account",
    "the subscription",
    "the warranty",
    "my contract",
    "the data export",
    "the login page",
    "my shipping address",
    "the mobile app",
    "the billing cycle",
    "my license",
    "the API key",
    "the privacy policy",
    "the late fee",
    "my parcel",
    "the new plan",
]
TEMPLATES = [
    "How do I change {s}?",
    "Why was {s} rejected?",
    "Can you help me with {s}?",
    "What happens to {s} after I cancel?",
    "Where can I find {s}?",
    "Is there a problem with {s}?",
    "Who is responsible for {s}?",
    "When will {s} be updated?",
]

# Prompts a user of the demo can try. The first six are in the training set, the last six are
# not (new subjects and new question shapes).
SEEN_PROMPTS = [
    "How do I change my password?",
    "Why was the refund rejected?",
    "Can you help me with my order?",
    "Where can I find the warranty?",
    "Is there a problem with the mobile app?",
    "When will the billing cycle be updated?",
]
UNSEEN_PROMPTS = [
    "My printer makes a strange noise, what should I do?",
    "Could you explain the termination clause to me?",
    "I was charged twice this month.",
    "What is the weather like in the office today?",
    "Please summarise the meeting notes from yesterday.",
    "Does the lease allow pets in the apartment?",
]
DEMO_PROMPTS = SEEN_PROMPTS + UNSEEN_PROMPTS

# Raw completion prompts are framed like this; chat requests use the tokenizer's chat template.
COMPLETION_FORMAT = "Question: {question}\nAnswer:"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]


def completion_prompt(question: str) -> str:
    return COMPLETION_FORMAT.format(question=question)


def training_questions(seed: int = 0) -> list[str]:
    """~160 varied questions: every template over every subject, shuffled with a fixed seed."""
    questions = [t.format(s=s) for t, s in itertools.product(TEMPLATES, SUBJECTS)]
    questions = [q for q in questions if q not in UNSEEN_PROMPTS]
    random.Random(seed).shuffle(questions)
    return questions


def tokenizer_corpus() -> list[str]:
    """Everything the demo model will read or write, so that the tokenizer covers it well."""
    lines = training_questions() + DEMO_PROMPTS + list(PHRASES.values())
    lines += [completion_prompt(q) for q in DEMO_PROMPTS]
    lines += [
        "The quick brown fox jumps over the lazy dog.",
        "Adapters change how a shared base model answers, one tenant at a time.",
        "Please wait while we look into your request and get back to you soon.",
        "Contracts, invoices, refunds, deliveries and accounts are common topics.",
        "0 1 2 3 4 5 6 7 8 9 10 100 1000 yes no okay thanks please sorry",
    ]
    return lines
