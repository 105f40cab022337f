"""Plugins and per-part config sections: user modules imported before the config is validated (YAML
``plugins:``, ``--plugin``, the ``rlvr.plugins`` entry points), sections declared where a part registers,
and the built-in variants' sections loading every recipe exactly as before they left ``RLConfig``."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from rlvr import cli
from rlvr.config import build_config, config_to_dict
from rlvr.errors import ConfigError
from rlvr.plugins import load_entry_points
from rlvr.registry import CONFIG_SECTIONS, Registry
from rlvr.schedules import SCHEDULES

import rlvr.variants.builtin  # noqa: F401 (every built-in part registered before `isolated` saves the registries)

SNAPSHOT = Path(__file__).with_name("config_snapshots") / "recipes_resolved.json"
PLUGIN = '''
from pydantic import BaseModel, ConfigDict
from rlvr.schedules import SCHEDULES, OnPolicySchedule

class MyAlgoConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    anneal_end: int = 10
    start: float = 0.1

@SCHEDULES.register("{name}", config=MyAlgoConfig, section="{name}")
def make(cfg):
    return OnPolicySchedule.from_config(cfg)
'''


@pytest.fixture
def isolated(tmp_path_factory):
    """Registries, the test's plugin modules and ``sys.path`` put back after the test (a plugin's parts
    stay out of the other tests' configs)."""
    saved = [(r, dict(r._items), dict(r._sections)) for r in (CONFIG_SECTIONS, SCHEDULES)]
    path, base = list(sys.path), str(tmp_path_factory.getbasetemp())
    yield
    for r, items, sections in saved:
        r._items, r._sections = items, sections
    for name, m in list(sys.modules.items()):
        if str(getattr(m, "__file__", None) or "").startswith(base):
            del sys.modules[name]
    sys.path[:] = path


def _plugin(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / f"{name}.py"
    p.write_text(PLUGIN.replace("{name}", name))
    return p


def _recipe(folder: Path, text: str) -> Path:
    p = folder / "algo.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def test_a_yaml_plugin_is_imported_before_validation_and_its_section_is_typed(tmp_path, isolated, monkeypatch):
    _plugin(tmp_path / "cfgdir", "my_algo_a")
    recipe = _recipe(tmp_path / "cfgdir", "plugins: [my_algo_a]\nschedule: my_algo_a\nmy_algo_a: {anneal_end: 3}\n")
    monkeypatch.chdir(tmp_path)  # found from the config's folder, not the working directory
    cfg = build_config([recipe])
    assert cfg.my_algo_a.anneal_end == 3 and cfg.my_algo_a.start == 0.1 and cfg.plugins == ["my_algo_a"]
    assert config_to_dict(cfg)["my_algo_a"] == {"anneal_end": 3, "start": 0.1}
    assert SCHEDULES.section_of("my_algo_a") == "my_algo_a"
    import pickle

    assert pickle.loads(pickle.dumps(cfg)) == cfg  # by value: the class is built per set of sections
    with pytest.raises(ConfigError, match=r"my_algo_a\.anneal_ed: unknown key; did you mean 'my_algo_a\.anneal_end'\?"):
        build_config([recipe], ["my_algo_a.anneal_ed=4"])
    with pytest.raises(ConfigError, match=r"my_algo_a\.anneal_end: Input should be a valid integer"):
        build_config([recipe], ["my_algo_a.anneal_end=soon"])


def test_without_the_plugin_its_section_is_an_unknown_key(tmp_path, isolated):
    recipe = _recipe(tmp_path, "my_algo_b: {anneal_end: 3}\n")
    with pytest.raises(ConfigError, match=r"my_algo_b: unknown key"):
        build_config([recipe])
    _plugin(tmp_path, "my_algo_b")
    assert build_config([recipe], plugins=["my_algo_b"]).my_algo_b.anneal_end == 3  # what --plugin passes


def test_a_plugin_file_path_is_found_from_the_config_folder(tmp_path, isolated, monkeypatch):
    _plugin(tmp_path / "cfgdir" / "algos", "my_algo_c")
    recipe = _recipe(tmp_path / "cfgdir", "plugins: [algos/my_algo_c.py]\nschedule: my_algo_c\n")
    monkeypatch.chdir(tmp_path)
    cfg = build_config([recipe])
    assert cfg.schedule == "my_algo_c" and "my_algo_c" in sys.modules and cfg.my_algo_c.anneal_end == 10
    with pytest.raises(ConfigError, match=r"plugin 'algos/nope\.py': file not found"):
        build_config([recipe], ["plugins=[algos/nope.py]"])


@pytest.mark.parametrize("argv_tail, match", [
    (["--plugin", "no_such_plugin_xyz"], r"plugin 'no_such_plugin_xyz' failed to import: ModuleNotFoundError"),
    (["--config", "{recipe}"], r"plugin 'broken_plugin' failed to import: ZeroDivisionError: division by zero"),
])
def test_a_plugin_that_fails_to_import_exits_2_naming_it(tmp_path, isolated, capsys, argv_tail, match):
    (tmp_path / "broken_plugin.py").write_text("1 / 0\n")
    recipe = _recipe(tmp_path, "plugins: [broken_plugin]\n")
    argv = ["train", *[a.replace("{recipe}", str(recipe)) for a in argv_tail], f"logging.output_dir={tmp_path / 'run'}"]
    assert cli.main(argv) == 2
    import re

    assert re.search(match, capsys.readouterr().err)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv", [
    ["train"], ["eval"], ["eval-merge", "x.samples.jsonl", "--out", "o.json"], ["export", "f", "--merge", "--out", "o"],
    ["plot", "run"], ["compare"],
])
def test_every_subcommand_takes_plugin_flags(argv, isolated, capsys):
    args = cli.parse_args([*argv, "--plugin", "a.b", "--plugin", "c.py"])
    assert args.plugins == ["a.b", "c.py"]
    assert cli.main([*argv, "--plugin", "no_such_plugin_xyz"]) == 2  # imported before the subcommand runs
    assert "plugin 'no_such_plugin_xyz' failed to import" in capsys.readouterr().err


def test_installed_packages_register_through_the_entry_point_group(tmp_path, isolated, monkeypatch):
    dist = tmp_path / "rlvr_fake_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: rlvr-fake-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[rlvr.plugins]\nfake = my_algo_ep\n")
    _plugin(tmp_path, "my_algo_ep")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_entry_points(force=True) == ["fake = my_algo_ep"]
    assert "my_algo_ep" in SCHEDULES and build_config(overrides=["my_algo_ep.start=0.5"]).my_algo_ep.start == 0.5
    (tmp_path / "my_algo_ep.py").write_text("raise RuntimeError('no GPU here')\n")
    del sys.modules["my_algo_ep"]
    with pytest.raises(ConfigError, match=r"entry point 'fake' \(my_algo_ep, group rlvr\.plugins\) failed to import: "
                                          r"RuntimeError: no GPU here"):
        load_entry_points(force=True)


def test_a_part_declares_its_section_when_it_registers():
    import rlvr.trainer.components  # noqa: F401 (every built-in part)
    from rlvr.variants.fbos_rl.config import FBOSConfig
    from rlvr.variants.mu_grpo.config import MuGRPOConfig
    from rlvr.parts import ADV_ESTIMATORS, MASKS, SAMPLERS

    assert SCHEDULES.section_of("staged") == "mu_grpo" and MASKS.section_of("veto") == "mu_grpo"
    assert SAMPLERS.section_of("feedback") == ADV_ESTIMATORS.section_of("fbos") == "fbos"
    assert SCHEDULES.section_of("on_policy") is None
    assert CONFIG_SECTIONS["mu_grpo"] is MuGRPOConfig and CONFIG_SECTIONS["fbos"] is FBOSConfig
    reg: Registry = Registry("x", "tests.X")
    with pytest.raises(ValueError, match="already registered"):  # one section, one model
        reg.register("a", config=dict, section="fbos")
    with pytest.raises(ValueError, match="needs config="):
        reg.register("b", section="b")


def test_every_recipe_resolves_as_before_the_sections_left_rlconfig():
    """Each built-in recipe's resolved config equals the one recorded at 61d2dc4 (when ``mu_grpo``,
    ``uec``, ``ib_tpo`` and ``fbos`` were fields of ``RLConfig``) at every recorded key; keys added
    since (``plugins``, other branches' new knobs) may exist."""
    want_all = json.loads(SNAPSHOT.read_text())
    assert len(want_all) == 15

    def check(got, want, path):
        if isinstance(want, dict):
            assert isinstance(got, dict), path
            for k, v in want.items():
                assert k in got, f"{path}.{k} missing"
                check(got[k], v, f"{path}.{k}")
        else:
            assert got == want, path

    for name, want in want_all.items():
        got = config_to_dict(build_config([name]))
        check(got, want, name)
        assert got["plugins"] == []
        import rlvr.trainer.components  # noqa: F401 (every built-in part declared its section by now)

        added_since = {"env", "streaming"}  # sections added on purpose after the snapshot (issue 26's environments, issue 39's streaming)
        new_sections = [k for k in set(got) - set(want) - added_since if isinstance(got[k], dict)]
        assert new_sections == [], f"{name}: a part declared a section under a new name: {new_sections}"


def test_the_staged_fresh_shuffle_check_moved_with_its_section():
    from rlvr.trainer.components import validate_components

    cfg = build_config(["mu_grpo"], ["engine=vllm", "max_async_level=1", "mu_grpo.stage_prompt_draw=fresh_shuffle"])
    with pytest.raises(ConfigError, match="fresh_shuffle .* use continue_loader"):
        validate_components(cfg)


def test_the_plan_context_has_the_step_count_and_the_schedules_section(tmp_path, tiny, toy_task):
    from rlvr.testing import small_config
    from rlvr.trainer.trainer import Trainer

    factory, tok = tiny
    tr = Trainer(small_config(tmp_path, "schedule=staged", "steps_per_generation=2", "max_steps=6"), factory(0), tok,
                 toy_task)
    ctx = tr.plan_ctx
    assert (ctx.global_step, ctx.max_steps) == (0, 6) and ctx.config is tr.cfg.mu_grpo
    tr.global_step = 4  # what a resumed run's plan sees
    assert ctx.global_step == 4
    tr2 = Trainer(small_config(tmp_path / "b"), factory(0), tok, toy_task)
    assert tr2.plan_ctx.config is None  # on_policy declares no section
