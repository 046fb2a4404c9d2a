"""The real vLLM engine on the demo model, driven the way production requests drive it (vLLM's
OpenAI serving classes behind the node's front, ``tests/serving/node/engine_path.py``): adapters
change the output as trained, generation is deterministic, vLLM's LoRA math matches
transformers+peft, mixed batches are correct, and a stream says what the whole answer says."""

from __future__ import annotations

import pytest

from apps.demo import corpus
from apps.demo.assets import DEMO_ADAPTERS, greedy_reference
from apps.serving.node.engine import AdapterHandle, Engine
from tests.serving.node import engine_path

pytestmark = pytest.mark.engine

PROMPTS = [corpus.completion_prompt(q) for q in corpus.DEMO_PROMPTS]


def handles(demo_dir) -> dict[str, AdapterHandle]:
    return {
        spec.name: AdapterHandle(i + 1, spec.name, demo_dir / "adapters" / spec.name)
        for i, spec in enumerate(DEMO_ADAPTERS)
    }


def generate(engine, prompt, adapter=None, **sampling):
    return engine.run(engine_path.complete(engine.engine, prompt, adapter=adapter, **sampling))


def test_each_adapter_answers_every_demo_prompt_with_its_own_phrase(engine, demo_dir):
    adapters = handles(demo_dir)
    for name, adapter in adapters.items():
        for prompt in PROMPTS:
            text = generate(engine, prompt, adapter).text.strip()
            assert text.startswith(corpus.PHRASES[name]), (name, prompt, text)


def test_chat_formatted_prompts_get_the_adapter_phrase_too(engine, demo_dir):
    tokenizer = engine.engine.tokenizer()
    adapter = handles(demo_dir)["legal-v1"]
    for question in corpus.UNSEEN_PROMPTS:
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
        assert generate(engine, prompt, adapter).text.strip().startswith(corpus.PHRASES["legal-v1"])


def test_base_model_says_none_of_the_adapter_phrases(engine):
    for prompt in PROMPTS:
        text = generate(engine, prompt).text
        assert not any(phrase in text for phrase in corpus.PHRASES.values()), (prompt, text)


def test_the_same_request_twice_gives_the_same_tokens(engine, demo_dir):
    adapter = handles(demo_dir)["support-v2"]
    sampled = {"max_tokens": 24, "temperature": 0.9, "seed": 42}
    for sampling in ({}, sampled):
        first = generate(engine, PROMPTS[8], adapter, **sampling)
        second = generate(engine, PROMPTS[8], adapter, **sampling)
        assert first.token_ids == second.token_ids
        assert len(first.token_ids) > 0


@pytest.mark.parametrize("name", [None, *[spec.name for spec in DEMO_ADAPTERS]])
def test_greedy_tokens_equal_transformers_and_peft_on_the_same_weights(engine, demo_dir, name):
    """The reference check of real LoRA math: vLLM vs transformers(+peft), float32, greedy."""
    adapter = handles(demo_dir)[name] if name else None
    adapter_dir = adapter.path if adapter else None
    expected = greedy_reference(demo_dir / "base-model", adapter_dir, PROMPTS, max_tokens=16)
    matched = total = 0
    for prompt, reference in zip(PROMPTS, expected, strict=True):
        got = generate(engine, prompt, adapter)
        # transformers stops at EOS; vLLM stops there too, and drops it from token_ids unless
        # it is the finishing token, so compare on the reference's length.
        got_ids = list(got.token_ids)[: len(reference)]
        total += len(reference)
        matched += sum(1 for a, b in zip(got_ids, reference, strict=False) if a == b)
        assert got_ids == reference, (name, prompt)
    print(f"reference check {name or 'base'}: {matched}/{total} tokens matched")


def test_a_batch_mixing_base_and_adapter_requests_gives_each_its_solo_tokens(engine, demo_dir):
    """Fails without apps/serving/node/lora_fix.py: base rows would pick up the last LoRA slot."""
    adapters = handles(demo_dir)
    jobs = []
    for prompt in PROMPTS[:4]:
        jobs += [(prompt, None), (prompt, adapters["support-v1"]), (prompt, adapters["legal-v1"])]
    solo = [generate(engine, prompt, adapter).token_ids for prompt, adapter in jobs]
    together = engine.run(engine_path.complete_together(engine.engine, jobs))
    assert [c.token_ids for c in together] == solo


def test_a_stream_through_the_node_s_front_says_what_the_whole_answer_says(engine, demo_dir):
    adapter = handles(demo_dir)["support-v1"]
    whole = generate(engine, PROMPTS[0], adapter)
    streamed, pieces = engine.run(engine_path.stream(engine.engine, PROMPTS[0], adapter=adapter))
    assert streamed.text == whole.text
    assert streamed.text.strip().startswith(corpus.PHRASES["support-v1"])
    assert streamed.finish_reason == whole.finish_reason
    assert pieces > 1  # token by token, not one event at the end
    assert streamed.model == whole.model == "alias-under-test"  # the name the caller asked for


def test_the_node_hears_of_a_request_s_last_token_once_and_only_for_one_choice():
    """The device-slot gate hands a slot on a step early when a request has one token left:
    vLLM's outputs, watched by the node, say so at max_tokens - 1 (once), never for n > 1
    or without a token limit."""
    import asyncio
    from types import SimpleNamespace

    from apps.serving.node.generation import Generation
    from apps.serving.node.vllm_front import _NodeEngine

    def output(tokens: int, finished: bool = False):
        piece = SimpleNamespace(
            index=0,
            token_ids=list(range(tokens)),
            text="x" * tokens,
            finish_reason="length" if finished else None,
        )
        return SimpleNamespace(
            request_id="r", finished=finished, prompt_token_ids=None, outputs=[piece]
        )

    async def outputs(counts):
        for n in counts:
            yield output(n, finished=n == counts[-1])

    def heard(counts, one_left: int) -> list[int]:
        seen: list[int] = []
        generation = Generation()
        generation.started("r")
        generation.on_last_token = lambda: seen.append(generation.completion_tokens)

        async def drain():
            async for _ in _NodeEngine._observed(outputs(counts), False, generation, "r", one_left):
                pass

        asyncio.run(drain())
        return seen

    assert heard([1, 2, 3, 4], one_left=3) == [3]  # cumulative counts, max_tokens 4
    assert heard([1, 2, 4], one_left=3) == []  # tokens came together: nothing to hand on
    assert heard([1, 2, 3, 4], one_left=-1) == []  # n > 1, or no limit


def test_vllm_gets_the_priority_the_node_gave_the_request_never_the_body_s():
    """The tenant's standing (serving/fairness.py) orders the requests waiting inside the
    engine; a priority vLLM's serving layer took from somewhere else is replaced."""
    from types import SimpleNamespace

    from apps.serving.node.generation import Generation
    from apps.serving.node.vllm_front import _CHOICE, _NodeEngine

    seen: dict = {}

    class Llm:
        def generate(self, prompt, sampling_params, request_id, **kwargs):
            seen.update(kwargs)
            return iter(())

    token = _CHOICE.set((None, "m", Generation(priority=7)))
    try:
        params = SimpleNamespace(output_kind=None, n=1, max_tokens=4)
        _NodeEngine(Llm()).generate("p", params, "r1", priority=-100)
    finally:
        _CHOICE.reset(token)
    assert seen["priority"] == 7


def generate_cached(engine, prompt: str, adapter: AdapterHandle) -> tuple[str, int]:
    """A greedy answer from vLLM itself, and how many of its prompt's tokens came from the
    prefix cache."""
    import uuid

    from vllm import SamplingParams

    async def run() -> tuple[str, int]:
        final = None
        async for output in engine.engine.llm.generate(
            prompt,
            SamplingParams(max_tokens=12, temperature=0),
            request_id=uuid.uuid4().hex,
            lora_request=Engine._lora_request(adapter),
        ):
            final = output
        assert final is not None
        return final.outputs[0].text.strip(), final.num_cached_tokens or 0

    return engine.run(run())


def test_with_prefix_caching_one_version_s_cached_prompt_never_answers_for_another(
    engine, demo_dir
):
    """vLLM #30931: a prefix cache keyed by what two versions share would hand one version's
    KV blocks to the other. Each version's engine name, id and folder are its own (the node
    never reuses them), so the same long prompt is cached per version and each answers with
    its own weights, as an alias moving between them back and forth would ask."""
    adapters = handles(demo_dir)
    v1, v2 = adapters["support-v1"], adapters["support-v2"]
    # longer than one KV block (128 tokens on the CPU), which is what the prefix cache keeps
    preamble = " ".join(corpus.DEMO_PROMPTS) * 2
    prompt = corpus.completion_prompt(f"{preamble} {corpus.UNSEEN_PROMPTS[1]}")
    assert len(engine.engine.tokenizer().encode(prompt)) > 128

    first_v1, cached = generate_cached(engine, prompt, v1)
    assert cached == 0
    first_v2, cached = generate_cached(engine, prompt, v2)
    assert cached == 0, "v2 was given v1's cached blocks"
    assert first_v1 != first_v2
    for version, first in ((v1, first_v1), (v2, first_v2), (v1, first_v1)):
        again, cached = generate_cached(engine, prompt, version)
        assert cached >= 128, "the prefix cache is on and kept this version's blocks"
        assert again == first, version.name
