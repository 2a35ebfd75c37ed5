"""SAELens trains on a ``lens store export --to saelens`` cache: run by test_saelens_trains.py in a process of its own.

    python saelens_consumer.py CACHE_FOLDER HOOK_NAME OUT_PREFIX

sae-lens 6.54.12 pins transformer-lens < 4 (``make setup`` installs it with ``--no-deps`` beside TL 4.3). Under TL 4.3
``import sae_lens`` stops at sae_lens/saes/sae.py:26, ``from transformer_lens.HookedTransformer import HookedRootModule``
(ModuleNotFoundError: TL 4.0 removed that module; HookedRootModule itself is kept, as transformer_lens.HookedRootModule),
and after it at the other module-level names of TL 3 (sae_lens/load_model.py:4-11: ``transformer_lens.HookedTransformer``,
``transformer_lens.utils``; sae_lens/analysis/hooked_sae_transformer.py:8: ``transformer_lens.components``). The
cached-activations path runs no language model, so this process gives those names what TL 4.3 has (HookedRootModule,
``transformer_lens.utilities``, "same names" per TL's own migration table) or an empty class for the model classes that
are never instantiated, and nothing else. A process of its own keeps the aliases out of the tests' interpreter.

With the cache, SAELens' own code does the rest: ``LanguageModelSAERunnerConfig(use_cached_activations=True,
cached_activations_path=...)``, ``LanguageModelSAETrainingRunner`` (its ActivationsStore.from_config, SAETrainer),
``ActivationsStore.get_raw_llm_batch`` / ``next_batch``. The tokenized dataset SAELens also asks for is the cache's own
token ids (``tokens`` column), as a researcher would pass the pretokenized corpus the cache was made from.

Writes OUT_PREFIX.json (version, how far training moved the encoder) and OUT_PREFIX_{acts,ids,mixed}.npy: every row
the ActivationsStore reads from the cache in order, and one shuffled training batch.
"""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import torch
import transformer_lens
import transformer_lens.utilities
from transformer_lens.HookedRootModule import HookedRootModule


def _tl3_names() -> None:
    class HookedTransformer(HookedRootModule):  # a base class SAELens subclasses at import; never built here
        pass

    legacy = types.ModuleType("transformer_lens.HookedTransformer")
    legacy.HookedTransformer, legacy.HookedRootModule = HookedTransformer, HookedRootModule
    legacy.Loss = legacy.Output = object  # type hints in sae_lens/load_model.py
    sys.modules[legacy.__name__] = legacy
    transformer_lens.HookedTransformer = HookedTransformer  # TL 4's module __getattr__ raises for this name
    sys.modules["transformer_lens.utils"] = transformer_lens.utilities
    for name in ("transformer_lens.components", "transformer_lens.components.mlps"):
        package = types.ModuleType(name)
        package.__path__ = []
        sys.modules[name] = package
    mlp = types.ModuleType("transformer_lens.components.mlps.can_be_used_as_mlp")
    mlp.CanBeUsedAsMLP = type("CanBeUsedAsMLP", (), {})
    sys.modules[mlp.__name__] = mlp


def main(folder: str, hook: str, out: str) -> None:
    _tl3_names()
    import sae_lens
    from datasets import Dataset, load_from_disk
    from sae_lens import (ActivationsStore, LanguageModelSAERunnerConfig, LanguageModelSAETrainingRunner,
                          LoggingConfig, StandardTrainingSAEConfig)

    cache = load_from_disk(folder)
    ctx, d_in = cache.features[hook].shape
    tokens = Dataset.from_dict({"tokens": np.asarray(cache.with_format("numpy")["token_ids"], np.int64)})
    cfg = LanguageModelSAERunnerConfig(
        sae=StandardTrainingSAEConfig(d_in=d_in, d_sae=2 * d_in, normalize_activations="none"),
        model_name="tiny-llama", hook_name=hook, context_size=ctx, is_dataset_tokenized=True, streaming=False,
        use_cached_activations=True, cached_activations_path=folder,
        training_tokens=64 * 5, train_batch_size_tokens=64, store_batch_size_prompts=2, n_batches_in_buffer=2,
        device="cpu", dtype="float32", logger=LoggingConfig(log_to_wandb=False), n_checkpoints=0,
        checkpoint_path=None, output_path=None, verbose=False, n_eval_batches=0, lr_warm_up_steps=0)
    runner = LanguageModelSAETrainingRunner(cfg, override_dataset=tokens, override_model=HookedRootModule())
    before = runner.sae.W_enc.detach().clone()
    sae = runner.run()
    moved = float((sae.W_enc.detach() - before).abs().max())

    store = ActivationsStore.from_config(HookedRootModule(), cfg, override_dataset=tokens)
    acts, ids = [], []
    for _ in range(len(cache) // cfg.store_batch_size_prompts):
        a, t = store.get_raw_llm_batch()
        acts.append(a)
        ids.append(t)
    np.save(f"{out}_acts.npy", torch.cat(acts).numpy())
    np.save(f"{out}_ids.npy", torch.cat(ids).numpy())
    np.save(f"{out}_mixed.npy", ActivationsStore.from_config(HookedRootModule(), cfg, override_dataset=tokens)
            .next_batch().numpy())
    with open(f"{out}.json", "w") as f:
        json.dump({"sae_lens": sae_lens.__version__, "sae": type(sae).__name__, "w_enc_moved": moved,
                   "weights_finite": bool(torch.isfinite(sae.W_enc).all())}, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
