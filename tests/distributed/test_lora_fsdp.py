"""LoRA (peft) under ``torchrun`` with FSDP2 (issue 16, item 6), gloo on CPU, tiny model.

* ``lora_worker.py`` (one 2-rank launch): adapter gradients of 2 ranks × half the groups equal the
  one-process gradients of all rows (every ``loss_agg_mode``, KL on/off, prompt sharing on/off; also
  replicated and with activation checkpointing); a 3-step Trainer run keeps the base bit-identical,
  keeps only adapters in the optimizer, re-merges the generation copy on every rank, takes the
  reference log-probs from the adapter-disabled policy, writes ``final/`` as a peft adapter folder, and
  resumes from its DCP checkpoint exactly.
* The same job's ``checkpoint-2`` loaded into one process (no process group): the adapters and the
  AdamW state are the job's, whole; the DCP holds the adapters only; the run continues; ``final/``
  loads into a one-process LoRA model.
* ``torchrun -m rlvr train model.lora.r=4``: the CLI run completes and ``final/`` loads with
  ``PeftModel.from_pretrained``.
"""

from __future__ import annotations

import json

import pytest
import torch

from .conftest import metric_rows, result_line, run_torchrun, tiny_run_args


@pytest.fixture(scope="module")
def lora_job(tmp_path_factory):
    """One 2-rank launch of ``lora_worker.py``: ``(output folder, its RESULT dict)``."""
    out = tmp_path_factory.mktemp("lora_job")
    proc = run_torchrun(["tests/distributed/lora_worker.py", str(out)])
    res = result_line(proc)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, res


def test_lora_under_fsdp2_matches_one_process_and_resumes_exactly(lora_job):
    _, res = lora_job
    grads = res["grads"]
    assert sum(k.startswith("fsdp|") for k in grads) == 20
    assert any(k.startswith("fsdp_ac|") for k in grads) and any(k.startswith("replicated|") for k in grads)
    for case, (diff, scale, a_scale) in grads.items():
        assert scale > 0 and a_scale > 0, f"{case}: zero adapter gradient (the comparison would be vacuous)"
        assert diff <= 1e-5 * scale, f"{case}: max |Δgrad| {diff:.3g} vs max |grad| {scale:.3g}"
    for k in grads:  # the KL term really reaches the gradient (else the beta cases would be vacuous)
        if "beta=0.1" in k:
            assert grads[k][1] != grads[k.replace("beta=0.1", "beta=0.0")][1], k
    t = res["train"]
    assert t["trainable_in_optimizer"] == t["lora_numel"] > 0  # only adapters are optimised
    assert t["base_bit_identical"] and t["base_tensors_checked"] > 10
    assert t["adapters_changed"]
    assert t["gen_equals_merged"] and t["gen_not_base"] and t["gen_same_on_all_ranks"] and t["engine_is_copy"]
    assert t["version"] == [3, 3]
    assert t["ref_vs_base_max_diff"] <= 1e-5 * t["ref_logp_scale"]
    assert {"adapter_config.json", "adapter_model.safetensors", "rlvr_base_model.json"} <= set(t["final_files"])
    assert "model.safetensors" not in t["final_files"]  # the adapter only, not a gathered base
    assert t["final_adapters_equal"] and t["final_adapter_tensors"] > 0
    assert t["resume_rows"] == 1 and t["resume_metrics_compared"] > 10
    assert t["resume_step3_max_metric_diff"] == 0.0 and t["resume_adapters_max_diff"] == 0.0


def test_two_rank_lora_checkpoint_loads_into_one_process(lora_job, tmp_path):
    """``checkpoint-2`` of the 2-rank job (DCP, ``world_size`` 2) resumed by a one-process ``Trainer``:
    every adapter and its AdamW ``exp_avg``/``exp_avg_sq``/``step`` equal what the job itself resumes
    with (``checkpoint-2.full.safetensors``, gathered whole by the worker), the frozen base stays the
    model's, the schedule position is restored and a third step trains; ``final/`` (gathered by rank 0)
    loads into a one-process LoRA model."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint import FileSystemReader

    from rlvr.lora import load_adapter_weights
    from rlvr.models.tiny import build_tiny_model
    from rlvr.testing import ToyTask, small_config
    from rlvr.trainer.checkpoint import load_checkpoint
    from rlvr.trainer.trainer import Trainer

    out, _ = lora_job
    ckpt = out / "checkpoint-2"
    model_keys = [k for k in FileSystemReader(str(ckpt / "dcp")).read_metadata().state_dict_metadata
                  if k.startswith("model.")]
    assert model_keys and all(".lora_" in k for k in model_keys), [k for k in model_keys if ".lora_" not in k]

    def one_process(folder):
        cfg = small_config(folder, "reward_timeout_s=0", "logging.tensorboard=false", "model.lora.r=4",
                           "model.lora.alpha=8", "beta=0.1", "max_steps=3", "save_steps=2")
        model, tok = build_tiny_model(0)
        return Trainer(cfg, model, tok, ToyTask())

    tr = one_process(tmp_path / "one")
    assert tr.world_size == 1 and tr.dp is None
    base = {n: t.clone() for n, t in tr.model.state_dict().items() if ".lora_" not in n}
    state = load_checkpoint(tr, ckpt)
    assert state["resharded_from"] == 2 and tr.global_step == 2 and tr.scheduler.last_epoch == 2
    ref = load_file(str(out / "checkpoint-2.full.safetensors"))
    adapters = {n: p for n, p in tr.model.named_parameters() if p.requires_grad}
    assert adapters and all(".lora_" in n for n in adapters)
    for n, p in adapters.items():
        assert torch.equal(p.detach(), ref[f"model|{n}"]), n
    assert all(torch.equal(t, base[n]) for n, t in tr.model.state_dict().items() if ".lora_" not in n)
    name_of = {id(p): n for n, p in adapters.items()}
    opt_params = [p for g in tr.optimizer.param_groups for p in g["params"]]
    assert sorted(name_of[id(p)] for p in opt_params) == sorted(adapters)  # adapters only, each once
    for p in opt_params:
        st, n = tr.optimizer.state[p], name_of[id(p)]
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(torch.as_tensor(st[k]).float(), ref[f"optim|{n}|{k}"].float()), (n, k)
        assert float(st["step"]) == 2  # two AdamW steps, not a fresh optimizer
    assert any(float(ref[f"optim|{n}|exp_avg_sq"].abs().sum()) > 0 for n in adapters)  # not all zeros
    tr.train()
    assert tr.global_step == 3 and any(not torch.equal(p.detach(), ref[f"model|{n}"]) for n, p in adapters.items())
    tr.close()

    fresh = one_process(tmp_path / "final")
    load_adapter_weights(fresh.model, out / "final")
    saved = load_file(str(out / "final" / "adapter_model.safetensors"))
    got = {n.replace(".default", ""): p for n, p in fresh.model.named_parameters() if ".lora_" in n}
    assert sorted(got) == sorted(saved) and all(torch.equal(got[n].detach(), saved[n]) for n in saved)
    fresh.close()


@pytest.mark.slow  # ~25 s each of interpreter start-up; the worker above runs the same Trainer path in the default suite
@pytest.mark.parametrize("generation_weights", ["copy", "gathered"])
def test_two_rank_lora_cli_run_writes_a_loadable_adapter(tiny_folder, tmp_path, generation_weights):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "run"
    proc = run_torchrun(["-m", "rlvr", "train", "--config", "grpo", *tiny_run_args(tiny_folder, out),
                         "model.lora.r=4", "model.lora.alpha=8", "beta=0.05", "save_steps=2",
                         f"distributed.generation_weights={generation_weights}"])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "FSDP2" in proc.stderr
    assert [r["step"] for r in metric_rows(out)] == [1, 2, 3]
    final = out / "final"
    assert (final / "adapter_model.safetensors").is_file() and not (final / "model.safetensors").exists()
    assert json.loads((final / "rlvr_base_model.json").read_text())["name_or_path"] == str(tiny_folder)
    pm = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_folder), str(final))
    assert any(".lora_B." in n and p.abs().sum() > 0 for n, p in pm.named_parameters())  # trained (B starts at 0)
    assert (out / "checkpoint-2" / "dcp").is_dir()  # DCP of adapters + optimizer
