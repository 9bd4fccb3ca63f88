"""Image rollouts from TRL's vLLM engine (colocated or a server) sampled from exactly the prompt the loss scores.

TRL 1.16 tokenizes a conversational image prompt with the processor, so its prompt ids already hold the N
`<|image|>` tokens of the crop, and then hands those ids together with the image to vLLM, whose GLM-OCR
prompt update replaces each `<|image|>` with N tokens again: the engine samples from a prompt with 2N - 1
image tokens, of which only N get image features. The wrappers here fix that on every device; the rollout
backend puts them in place (`grpo.rollouts.backend.RolloutBackend.install`):

- `one_expansion(generate)`: each run of image tokens is sent to the engine as one `<|image|>`, so vLLM's
  own expansion gives back the processor's N; the ids the engine processed are then checked against TRL's
  (`PromptMismatchError` if they differ, e.g. when the engine's image processor sizes a crop otherwise);
- `resetting_encoder_cache(sync)`: after every weight sync the engine's cache of vision-tower outputs is
  dropped (TRL resets only the prefix cache; cached image features would come from the old weights).

In server mode (`trl vllm-serve`) TRL sends its prompt ids as they are, with image data the server processed on
its own, placed at the runs of image tokens; the server does not expand them again. There the backend checks
instead that each run is as long as the server's processing of its image (`checked_placement`), and drops the
server's encoder cache after every weight sync (`resetting_server_encoder_cache`, vLLM's dev endpoint that
`trl vllm-serve` turns on).

`check_prompt_alignment` refuses a processor with which TRL's two tokenizations of one prompt (the prompt
ids, and the per-token `mm_token_type_ids`) differ in length, e.g. a chat template that writes the BOS token
the tokenizer adds again.

Crops are sized before they get here (`grpo.crop_size`).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

from grpo.errors import UserError

class PromptMismatchError(RuntimeError):
    """The engine processed other prompt ids than the ones the loss scores."""


class PromptAlignmentError(UserError, ValueError):
    """TRL's prompt ids and `mm_token_type_ids` of the same prompt would differ in length."""


def collapse_image_runs(ids: list[int], image_token_id: int) -> list[int]:
    """`ids` with each run of `image_token_id` shortened to one token (the placeholder vLLM expands)."""
    return [t for i, t in enumerate(ids) if t != image_token_id or i == 0 or ids[i - 1] != image_token_id]


def one_expansion(generate: Callable, image_token_id: int) -> Callable:
    """Wrap `VLLMGeneration.generate` (colocate mode): prompts with images go out with collapsed image runs;
    the engine's prompt ids must come back equal to the ones given."""

    @functools.wraps(generate)
    def wrapped(prompts, images, num_generations, profiler=None):
        if images is None:
            return generate(prompts=prompts, images=images, num_generations=num_generations, profiler=profiler)
        sent = [list(ids) if imgs is None else collapse_image_runs(list(ids), image_token_id)
                for ids, imgs in zip(prompts, images, strict=True)]
        engine_ids, *rest = generate(prompts=sent, images=images, num_generations=num_generations,
                                     profiler=profiler)
        for i, (got, want) in enumerate(zip(engine_ids, prompts, strict=True)):
            if list(got) != list(want):
                raise PromptMismatchError(
                    f"prompt {i}: vLLM processed {len(got)} prompt tokens "
                    f"({list(got).count(image_token_id)} image tokens), the loss scores {len(want)} "
                    f"({list(want).count(image_token_id)} image tokens): the engine's image processor must size "
                    "the crop as the checkpoint's processor does")
        return (engine_ids, *rest)

    return wrapped


def resetting_encoder_cache(sync: Callable, llm: Any) -> Callable:
    """Wrap a weight sync so that the engine's encoder (image feature) cache is dropped after it."""

    @functools.wraps(sync)
    def wrapped(*args, **kwargs):
        result = sync(*args, **kwargs)
        llm.llm_engine.reset_encoder_cache()
        return result

    return wrapped


def image_runs(ids: list[int], image_token_id: int) -> list[int]:
    """The lengths of the runs of `image_token_id` in `ids`, in order."""
    runs: list[int] = []
    for i, t in enumerate(ids):
        if t == image_token_id:
            if i > 0 and ids[i - 1] == image_token_id:
                runs[-1] += 1
            else:
                runs.append(1)
    return runs


def checked_placement(place: Callable, image_token_id: int) -> Callable:
    """Wrap `VLLMGeneration._place_features` (server mode): each image the server processed must fill exactly
    its run of image tokens in the prompt the loss scores (`PromptMismatchError` otherwise)."""

    @functools.wraps(place)
    def wrapped(features, prompt_ids):
        if features is not None:
            served = [p["length"] for p in features["mm_placeholders"]["image"]]
            runs = image_runs(list(prompt_ids), image_token_id)
            if served != runs:
                raise PromptMismatchError(
                    f"the vLLM server processed the image(s) into {served} image tokens, the prompt the loss scores "
                    f"holds runs of {runs}: the server's image processor must size the crop as the checkpoint's "
                    "processor does (serve the same checkpoint folder)")
        return place(features, prompt_ids)

    return wrapped


def resetting_server_encoder_cache(sync: Callable, vllm_generation: Any) -> Callable:
    """Wrap a server-mode weight sync so that the server's encoder (image feature) cache is dropped after it
    (on the main process, which holds the client)."""

    @functools.wraps(sync)
    def wrapped(*args, **kwargs):
        result = sync(*args, **kwargs)
        client = getattr(vllm_generation, "vllm_client", None)  # only the main process talks to the server
        if client is not None:
            response = client.session.post(f"{client.base_url}/reset_encoder_cache")
            if response.status_code != 200:
                raise RuntimeError(f"the vLLM server at {client.base_url} did not reset its encoder cache "
                                   f"({response.status_code}: {response.text[:200]}); start it with "
                                   "`trl vllm-serve` (or VLLM_SERVER_DEV_MODE=1 vllm serve)")
        return result

    return wrapped


def check_prompt_alignment(processor: Any, row: dict) -> None:
    """Tokenize the pool row `row` (TRL's `prompt` messages and `image`) both ways TRL does; refuse if the
    prompt ids and the `mm_token_type_ids` differ in length, or if the tokenizer adds to every encoding what
    the chat template writes already (PromptAlignmentError, with the fix)."""
    from trl.data_utils import apply_chat_template, prepare_multimodal_messages

    messages = prepare_multimodal_messages(row["prompt"], images=[row["image"]])
    ids = processor.apply_chat_template(conversation=[messages], add_generation_prompt=True, tokenize=True,
                                        return_dict=True)["input_ids"][0]
    text = apply_chat_template({"prompt": messages}, processor)["prompt"]
    fields = processor(images=[[row["image"]]], text=[text], padding=True, return_tensors="pt")
    per_token = fields.get("mm_token_type_ids", fields["input_ids"])
    tokenizer = getattr(processor, "tokenizer", processor)
    added = tokenizer.convert_ids_to_tokens(tokenizer("")["input_ids"])  # what plain encoding adds
    fix = ("keep them in the template and make the tokenizer stop adding them on plain encoding (add_bos_token, "
           "or the post_processor of its tokenizer.json)")
    if per_token.shape[-1] != len(ids):
        raise PromptAlignmentError(
            f"the processor tokenizes one prompt to {len(ids)} ids through its chat template but to "
            f"{per_token.shape[-1]} when TRL encodes the rendered text for the image fields (mm_token_type_ids); "
            f"the 3-D positions would be misplaced. The tokenizer adds {added} (BOS token {tokenizer.bos_token!r}) "
            f"to plain text that the chat template writes already (GLM-OCR's writes [gMASK]<sop>): {fix}")
    if added and text.startswith("".join(added)):  # both encodings agree, on a prompt that starts twice
        raise PromptAlignmentError(
            f"the chat template writes {added} and the tokenizer adds them again on encoding, so every prompt "
            f"starts with them twice (the model was trained on one): {fix}")

