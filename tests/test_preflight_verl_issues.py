"""verl's issue tracker as a corpus (docs/verl_issues.md): configurations verl users reported failing late, one test
per issue, named after it, through `python run.py ... preflight.only=true` as a user types it. Where verl 0.9.1 still
fails, the preflight refuses it (exit 2) and the printed fix, appended to the same command, passes (exit 0); where
0.9.1 no longer fails, the preflight lets it through. Also: a rollout engine name verl's schema takes is refused or
planned, never a traceback; and the Ray-cluster check follows Ray's own lookup (an environment check)."""

from __future__ import annotations

import itertools
import json
import re
import shlex
from pathlib import Path

import pytest
from conftest import NOT_READY_EXIT, composed, run_py

from grpo_lab.checks.preflight import run_preflight
from grpo_lab.checks.rules import memory_ids
from grpo_lab.memory.run import Run

PLANNED = (0, NOT_READY_EXIT)  # a plan that holds: ready here, or not (no GPU on the CPU test machine)

# static batching (no dynamic batch size): the micro-batch sizes verl then validates
STATIC = ("actor_rollout_ref.actor.use_dynamic_bsz=false", "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=false",
          "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=false")
# verl's deprecated legacy trainer: it pads nothing (grpo_lab/checks/rules/batch.py Mode)
LEGACY = ("trainer.use_v1=false",)
_JOB = itertools.count()


def preflight(tmp_path, *args: str, env: dict | None = None) -> tuple[int, dict, str]:
    """python run.py preflight.only=true ARGS: (exit code, plan.json, console text)."""
    job = tmp_path / f"job{next(_JOB)}"
    out = run_py("preflight.only=true", *args, f"hydra.run.dir={job}", env=env)
    text = out.stdout + out.stderr
    assert "Traceback" not in text, text[-3000:]
    return out.returncode, json.loads((job / "plan.json").read_text()), text


def rules(problems) -> set[str]:
    return {p["rule"] for p in problems}


def printed_fix(plan: dict, rule: str) -> list[str]:
    """What the user appends: `Fix all ... together` with several errors when it is offered (it is not when the memory
    plan would still be tight with it: then the console points at `make fit`), else the rule's first alternative."""
    if len(plan["errors"]) > 1 and "fix_all" in plan:
        assert plan["fix_all"]["passes"], plan
        return shlex.split(plan["fix_all"]["overrides"])
    (p,) = [p for p in plan["errors"] if p["rule"] == rule]
    assert p["checked"].startswith("re-checked: the preflight passes"), p
    return shlex.split(p["fix"].split("  or  ")[0])


def refused_then_fixed(tmp_path, args: tuple[str, ...], rule: str, *says: str, rerun: bool = False
                       ) -> tuple[dict, dict]:
    """The command is refused by `rule` (its message saying each of `says`); with the printed fix appended it passes:
    through run.py again when `rerun` (the rules new here), else composed as run.py composes it (a second run.py is
    ~2 s on the 2-core machine; the existing rules' fixes also go through run.py in test_preflight_fixes.py)."""
    rc, plan, text = preflight(tmp_path, *args)
    assert rc == 2 and rule in rules(plan["errors"]), text[-3000:]
    (p,) = [p for p in plan["errors"] if p["rule"] == rule]
    for s in says:
        assert s in p["message"], (s, p["message"])
    fix = printed_fix(plan, rule)
    if rerun:
        rc2, plan2, text2 = preflight(tmp_path, *args, *fix)
        assert rc2 in PLANNED and not plan2["errors"], (fix, text2[-3000:])
    else:
        r = run_preflight(Run.build(*composed(*args, *fix), {}), launching=False)
        left = {p.rule for p in r.errors}
        # the fix clears its rule; what may remain is memory, which the console sends to `make fit` (a micro-batch
        # that verl accepts can still be too large for the card: #405's 80 sequences of 1536 tokens a micro-batch)
        assert rule not in left and left <= set(memory_ids()) and (not left or plan.get("fit")), (fix, r.format())
    return p, plan


# ---- still failing in verl 0.9.1: refused, with a fix that works ----------------------------------------------------

def test_verl_issue_6801_agent_workers_equal_chunk(tmp_path):
    """2 GPUs, 12 prompts x 5 answers over the default 8 agent loop workers: 60/8 with the legacy trainer."""
    args = ("trainer.use_v1=false", "ngpus_per_node=2", "train_batch_size=12", "rollout_n=5", "ppo_mini_batch_size=6")
    p, _ = refused_then_fixed(tmp_path, args, "agent_loop_workers",
                           "only support equal chunk. Got size of DataProto 60 and chunk 8", rerun=True)
    assert "trainer.use_v1=true" in p["fix"]
    # verl 0.9.1's V1 trainer (the default) splits unequal parts (trainer/ppo/v1/agent_loop_tq.py): not refused
    rc, plan, text = preflight(tmp_path, *args[1:])
    assert rc in PLANNED and "agent_loop_workers" not in rules(plan["errors"]), text[-2000:]


def test_verl_issue_1004_divisibility_chain(tmp_path):
    """10 prompts x 3 answers, mini-batch 4, micro-batch 2 on 4 GPUs, static batching and the legacy trainer (the
    issue's verl had no other): four rules of the chain, one fix for all."""
    args = (*LEGACY, *STATIC, "train_batch_size=10", "rollout_n=3", "ppo_mini_batch_size=4",
            "ppo_micro_batch_size_per_gpu=2", "log_prob_micro_batch_size_per_gpu=1")
    refused_then_fixed(tmp_path, args, "batch_divisibility",
                       "'real_train_batch_size (30) must be divisible by minimal possible batch size (4)'")
    r = run_preflight(Run.build(*composed(*args), {}), launching=False)
    assert {"batch_divisibility", "updates_per_step_integer", "micro_batch"} <= {p.rule for p in r.errors}
    # verl 0.9.1's V1 trainer (the default) pads a step that is not whole mini-batches instead: a warning there
    r = run_preflight(Run.build(*composed(*args[1:]), {}), launching=False)
    assert "updates_per_step_integer" in {p.rule for p in r.warnings}
    assert {"batch_divisibility", "micro_batch"} <= {p.rule for p in r.errors}


def test_verl_issue_606_train_batch_below_the_gpu_count(tmp_path):
    """2 nodes x 4 GPUs and 1 prompt x 4 answers per step: 4 trajectories over 8 GPUs ('only support equal chunk'),
    with the legacy trainer the issue's verl had: it splits the step in equal parts over the ranks."""
    args = ("nnodes=2", "train_batch_size=1", "ppo_mini_batch_size=1", "rollout_n=4")
    refused_then_fixed(tmp_path, (*LEGACY, *args), "batch_divisibility",
                       "4 trajectories per step do not split over the 8 data-parallel GPUs",
                       "'number of items:[4] < k_partitions:[8]'")
    # without dynamic batching verl's validate_config counts every GPU, sequence-parallel ones too
    args = (*STATIC, "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=2", "train_batch_size=6",
            "ppo_mini_batch_size=2", "rollout_n=3", "ppo_micro_batch_size_per_gpu=1",
            "log_prob_micro_batch_size_per_gpu=1")
    refused_then_fixed(tmp_path, args, "batch_divisibility",
                       "'real_train_batch_size (18) must be divisible by minimal possible batch size (4)'")


def test_verl_issue_606_shape_under_v1_with_dynamic_batching_is_padded(tmp_path):
    """The same step in grpo-lab's default mode (verl 0.9.1's V1 trainer, dynamic batching): the trainer pads it with
    no-op samples (trainer_base.py _balance_batch -> padding_utils.py): a warning that names the padding. The
    mini-batch of 4 over 8 GPUs still fails in the V1 worker (engine_workers.py), so that one is refused; a mini-batch
    of 2 prompts (8 trajectories) runs, the train batch below it padded too."""
    rc, plan, text = preflight(tmp_path, "nnodes=2", "train_batch_size=1", "ppo_mini_batch_size=1", "rollout_n=4")
    assert rc == 2 and rules(plan["errors"]) == {"mini_batch_divisibility"}, text[-3000:]
    (w,) = [w for w in plan["warnings"] if w["rule"] == "batch_divisibility"]
    assert "4 trajectories per step do not split over the 8 data-parallel GPUs" in w["message"]
    assert "verl's V1 trainer with dynamic batching runs it" in w["message"]
    assert "padded with 4 synthetic no-op samples to 8" in w["message"] and "50% of each step" in w["message"]
    rc, plan, text = preflight(tmp_path, "nnodes=2", "train_batch_size=1", "ppo_mini_batch_size=2", "rollout_n=4")
    assert rc in PLANNED and not plan["errors"], text[-3000:]
    assert {"batch_divisibility", "train_batch_vs_mini_batch"} <= rules(plan["warnings"])
    assert plan["batch"]["padding"] == {"multiple": 8, "padded_trajectories": 8, "samples": 4, "fraction": 0.5,
                                        "updates_per_step": 1}


def test_verl_issue_405_micro_batch_larger_than_mini_batch(tmp_path):
    """A micro-batch of 256 against 64 x 5 / 4 = 80 trajectories per GPU per mini-batch."""
    refused_then_fixed(tmp_path, (*STATIC, "ppo_micro_batch_size_per_gpu=256"), "micro_batch",
                       "data size must be divisible by force_group_size * micro_batch_size_per_gpu")


def test_verl_issue_559_train_batch_smaller_than_mini_batch(tmp_path):
    """verl raises 'train_batch_size (32) must be >= actor.ppo_mini_batch_size (64)' without dynamic batching."""
    refused_then_fixed(tmp_path, (*STATIC, "train_batch_size=32"), "train_batch_vs_mini_batch",
                       "smaller than the PPO mini-batch",
                       "'ValueError: train_batch_size (32) must be >= actor.ppo_mini_batch_size (64)'")


def test_verl_issue_1191_rollout_tp_over_one_gpu(tmp_path):
    """rollout tensor parallel 2 on a single GPU: 'rollout world_size: 1 is not divisible by infer_world_size: 2'."""
    refused_then_fixed(tmp_path, ("ngpus_per_node=1", "rollout_tp=2"), "rollout_parallel",
                       "rollout world_size: 1 is not divisible by infer_world_size: 2")


def test_verl_issue_3088_token_budget_below_one_sequence(tmp_path):
    """Dynamic batching with 1000 tokens per GPU and 512 + 1024-token sequences: 'max_token_len must be greater'."""
    refused_then_fixed(tmp_path, ("ppo_max_token_len_per_gpu=1000",), "token_budget", "cannot hold one full sequence")


def test_verl_issue_1226_ulysses_sp_must_divide_the_heads(tmp_path):
    """SmolLM2-135M has 9 attention heads: Ulysses SP 2 cannot split them."""
    sp2 = "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=2"
    refused_then_fixed(tmp_path, ("model=smollm2_135m", sp2), "ulysses_sequence_parallel",
                       "'num_attention_heads 9 must be divisible by ulysses_sp_size 2'", rerun=True)
    refused_then_fixed(tmp_path, (sp2, "actor_rollout_ref.model.use_remove_padding=false"),
                       "ulysses_sequence_parallel", "you must enable `use_remove_padding`")


def test_verl_issue_673_max_model_len_below_the_prompt(tmp_path):
    """rollout.max_model_len at max_prompt_length: a long prompt leaves no room; above the model's positions:
    refused."""
    refused_then_fixed(tmp_path, ("actor_rollout_ref.rollout.max_model_len=512",), "rollout_max_model_len",
                       "leaves no room to generate", rerun=True)
    refused_then_fixed(tmp_path, ("actor_rollout_ref.rollout.max_model_len=50000",), "rollout_max_model_len",
                       "should be less than or equal to max_position_embeddings (40960)")
    # between the prompt and prompt + response: answers cut short, said, not refused
    rc, plan, _ = preflight(tmp_path, "actor_rollout_ref.rollout.max_model_len=1000")
    assert rc in PLANNED and "rollout_max_model_len" in rules(plan["warnings"])


# ---- no longer failing in verl 0.9.1: let through --------------------------------------------------------------

def test_verl_issue_189_chunked_prefill_off_with_a_small_token_batch(tmp_path):
    """max_num_batched_tokens below max_model_len with chunked prefill off: verl 0.9.1 raises max_num_batched_tokens to
    max_model_len itself (vllm_async_server.py _validate_configs), so nothing is refused."""
    rc, plan, text = preflight(tmp_path, "actor_rollout_ref.rollout.enable_chunked_prefill=false",
                               "actor_rollout_ref.rollout.max_num_batched_tokens=1024")
    assert rc in PLANNED and not plan["errors"], text[-2000:]


def test_verl_issue_145_dynamic_batching_without_micro_batch(tmp_path):
    """With dynamic batching verl 0.9.1 needs no micro-batch size (workers/config/actor.py checks it only without)."""
    rc, plan, text = preflight(tmp_path, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null",
                               "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=null")
    assert rc in PLANNED and not plan["errors"], text[-2000:]


# ---- a rollout engine verl's schema takes: refused or planned, never a traceback ----------------------------------

def test_unknown_rollout_engine_is_refused_without_a_traceback(tmp_path):
    """rollout.name=hf: verl's config takes it, its registries do not (worker: 'Rollout hf with mode async not
    found'): refused with a fix, plan.json written, the memory plan marked not measured."""
    p, plan = refused_then_fixed(tmp_path, ("actor_rollout_ref.rollout.name=hf",), "rollout_engine_known",
                                 "'Rollout hf with mode async not found'", "sglang, trtllm, vllm", rerun=True)
    assert p["fix"] == "actor_rollout_ref.rollout.name=vllm"
    assert plan["memory"]["verdict"] == {"overall": "not measured"}
    assert "'hf' not measured" in plan["memory"]["not_measured"]


def test_engine_verl_knows_but_the_plan_does_not_is_planned_as_not_measured(tmp_path):
    """rollout.name=trtllm: in verl's registries, not in the memory plan: no memory verdict, said so; make fit says why
    it cannot search."""
    rc, plan, text = preflight(tmp_path, "actor_rollout_ref.rollout.name=trtllm")
    assert rc in PLANNED and not plan["errors"], text[-2000:]
    assert plan["memory"]["verdict"] == {"overall": "not measured"}
    assert any("rollout engine 'trtllm' not measured" in n for n in plan["notes"])
    out = run_py("preflight.fit=true", "actor_rollout_ref.rollout.name=trtllm", f"hydra.run.dir={tmp_path / 'fit'}")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "rollout engine 'trtllm': the memory plan has not been measured with it" in out.stderr


# ---- the Ray cluster: Ray's own lookup, an environment check -------------------------------------------------------

# verl's multi-node example (examples/grpo_trainer/run_qwen2_5_32b_fsdp.sh: NNODES=2, NGPUS_PER_NODE=8), its Ray
# part, on 8-GPU nodes; the model is the default (the 32B plan is the memory rules' business, not this check's)
MULTI_NODE = ("hardware=a100_80gbx8", "trainer.nnodes=2", "trainer.n_gpus_per_node=8")


def test_verl_multi_node_script_plans_on_a_planning_machine(tmp_path):
    rc, plan, text = preflight(tmp_path, *MULTI_NODE)
    assert rc in PLANNED and not plan["errors"], text[-2000:]
    assert any("trainer.nnodes=2: the Ray cluster is not checked here (not launching)" in n for n in plan["notes"])


@pytest.fixture
def launch_env(tmp_path):
    """Launching here (no preflight.only) with no GPU visible: the refusal is certain, nothing starts."""
    return {"RAY_TMPDIR": str(tmp_path / "raytmp"), "CUDA_VISIBLE_DEVICES": ""}


def _launch(tmp_path, env, *args):
    job = tmp_path / f"launch{next(_JOB)}"
    out = run_py(*args, f"hydra.run.dir={job}", env=env)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stdout[-2000:] + out.stderr[-2000:]
    return json.loads((job / "plan.json").read_text())


def test_verl_multi_node_script_joins_the_cluster_ray_start_recorded(tmp_path, launch_env):
    """On a head node prepared as verl documents (`ray start --head`), ray.init() with no address joins the cluster
    recorded in <RAY_TMPDIR>/ray/ray_current_cluster; without that record it would start a one-machine Ray."""
    plan = _launch(tmp_path, launch_env, *MULTI_NODE)
    (p,) = [p for p in plan["errors"] if p["rule"] == "ray_nnodes_without_cluster"]
    assert "ray_current_cluster is absent" in p["message"] and "ray start --head" in p["fix"]
    record = tmp_path / "raytmp" / "ray"
    record.mkdir(parents=True)
    (record / "ray_current_cluster").write_text("10.0.0.7:6379\n")
    plan = _launch(tmp_path, launch_env, *MULTI_NODE)
    assert "ray_nnodes_without_cluster" not in rules(plan["errors"])
    # and then Ray refuses the hardware file's num_cpus for a cluster it joins: said, with the fix
    (p,) = [p for p in plan["errors"] if p["rule"] == "ray_join_num_cpus"]
    assert "10.0.0.7:6379" in p["message"] and p["fix"] == "ray_kwargs.ray_init.num_cpus=null"
    assert "(by conf/hardware/a100_80gbx8.yaml," in p["message"]


def test_the_start_ray_advice_followed_as_printed_joins_without_a_refusal(tmp_path, launch_env):
    """Issue 43 item 2: `ray start --head`, then the same command as the advice says (with num_cpus=null appended),
    is refused by no Ray rule; num_cpus typed on the command line is said to come from there."""
    for own in ((), ("ray_kwargs.ray_init.num_cpus=32",)):
        (tmp_path / "raytmp" / "ray" / "ray_current_cluster").unlink(missing_ok=True)
        (p,) = [p for p in _launch(tmp_path, launch_env, *MULTI_NODE, *own)["errors"]
                if p["rule"] == "ray_nnodes_without_cluster"]
        appended = re.search(r"then the same command with (\S+) appended joins it", p["fix"]).group(1)
        (tmp_path / "raytmp" / "ray").mkdir(parents=True, exist_ok=True)  # what `ray start --head` records
        (tmp_path / "raytmp" / "ray" / "ray_current_cluster").write_text("10.0.0.7:6379\n")
        if own:
            (q,) = [q for q in _launch(tmp_path, launch_env, *MULTI_NODE, *own)["errors"]
                    if q["rule"] == "ray_join_num_cpus"]
            assert "num_cpus=32 is set (by the command line," in q["message"], q["message"]
        errors = _launch(tmp_path, launch_env, *MULTI_NODE, *own, appended)["errors"]
        assert not [e for e in errors if e["rule"].startswith("ray_")], errors


# ---- verl's example scripts: planned, never refused for what verl 0.9.1 runs ----------------------------------------

QWEN25_MATH_7B = Path(__file__).resolve().parent / "fixtures" / "synthetic" / "qwen2_5_math_7b"  # 4096 positions
# verl's DAPO recipe (recipe/dapo/test_dapo_7b_math.sh: Qwen2.5-Math-7B, 8 nodes of 8 GPUs), its overrides as the
# script passes them to verl, the reward lines in 0.9.1's keys (the script's own top-level reward_model.* lines are
# keys 0.9.1 never reads: test_preflight_trust.py); the model is its architecture (a config.json, no weights)
DAPO_7B_MATH = (
    "hardware=a100_80gbx8", f"model_path={QWEN25_MATH_7B}", "trainer.nnodes=8", "trainer.n_gpus_per_node=8",
    "data.prompt_key=prompt", "data.truncation=left", "data.max_prompt_length=2048", "data.max_response_length=8192",
    "data.train_batch_size=512", "actor_rollout_ref.rollout.n=16", "algorithm.adv_estimator=grpo",
    "algorithm.use_kl_in_reward=False", "algorithm.kl_ctrl.kl_coef=0.0", "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.actor.kl_loss_coef=0.0", "actor_rollout_ref.actor.clip_ratio_low=0.2",
    "actor_rollout_ref.actor.clip_ratio_high=0.28", "actor_rollout_ref.actor.clip_ratio_c=10.0",
    "actor_rollout_ref.model.use_remove_padding=True",
    "+actor_rollout_ref.model.override_config.max_position_embeddings=32768",
    "actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=20480",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=30720",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=30720",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True", "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.optim.lr_warmup_steps=10", "actor_rollout_ref.actor.optim.weight_decay=0.1",
    "actor_rollout_ref.actor.ppo_mini_batch_size=32", "actor_rollout_ref.actor.fsdp_config.param_offload=True",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True", "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.actor.grad_clip=1.0", "actor_rollout_ref.actor.loss_agg_mode=token-mean",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size=4", "actor_rollout_ref.rollout.gpu_memory_utilization=0.80",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=4", "actor_rollout_ref.rollout.enable_chunked_prefill=True",
    "actor_rollout_ref.rollout.max_num_batched_tokens=10240", "actor_rollout_ref.rollout.temperature=1.0",
    "actor_rollout_ref.rollout.top_p=1.0", "actor_rollout_ref.rollout.top_k=-1",
    "actor_rollout_ref.rollout.val_kwargs.temperature=1.0", "actor_rollout_ref.rollout.val_kwargs.top_p=0.7",
    "actor_rollout_ref.rollout.val_kwargs.top_k=-1", "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
    "actor_rollout_ref.rollout.val_kwargs.n=1", "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size=4", "actor_rollout_ref.actor.fsdp_config.fsdp_size=32",
    "reward.reward_manager.name=dapo", "+reward.reward_kwargs.overlong_buffer_cfg.enable=True",
    "+reward.reward_kwargs.overlong_buffer_cfg.len=4096",
    "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
    "+reward.reward_kwargs.overlong_buffer_cfg.log=False", "+reward.reward_kwargs.max_resp_len=8192",
    "trainer.val_before_train=True", "trainer.test_freq=10", "trainer.save_freq=10", "trainer.total_epochs=10",
    "trainer.total_training_steps=200", "trainer.resume_mode=auto", "trainer.log_val_generations=10",
)
POSITIONS = "+actor_rollout_ref.model.override_config.max_position_embeddings=32768"


def test_verl_dapo_recipe_is_planned_with_the_positions_its_override_gives_the_model(tmp_path):
    """Issue 28 item 9: Qwen2.5-Math-7B has 4096 positions and the recipe's 2048 + 8192 tokens need 10240; its
    override_config.max_position_embeddings=32768 is applied by verl to the model's config before the rollout checks
    max_model_len against it. vLLM 0.24 reads the model's own config.json, though, and refuses 10240 > 4096 unless
    VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (what the recipe's users export): refused without it, with it as the fix; planned
    with it set in the launching shell. Without the override line verl itself refuses."""
    p, _ = refused_then_fixed(tmp_path, DAPO_7B_MATH, "rollout_max_model_len", "own max_position_embeddings (4096",
                              "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1", rerun=True)
    rc, plan, text = preflight(tmp_path, *DAPO_7B_MATH, env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    assert rc in PLANNED and not plan["errors"], text[-3000:]
    assert plan["memory"]["kv_cache"]["max_model_len"] == 10240
    p, _ = refused_then_fixed(tmp_path, tuple(a for a in DAPO_7B_MATH if a != POSITIONS), "rollout_max_model_len",
                              "max_position_embeddings (4096, ", "should be less than or equal to")
    assert "override_config" not in p["message"]
    rc, plan, _ = preflight(tmp_path, *DAPO_7B_MATH, POSITIONS.replace("32768", "8192").lstrip("+"))
    (p,) = plan["errors"]
    assert (rc, p["rule"]) == (2, "rollout_max_model_len")
    assert "(8192, actor_rollout_ref.model.override_config.max_position_embeddings)" in p["message"]
