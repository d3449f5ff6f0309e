"""Site configuration: lookup order, provenance, and errors naming file, key and valid keys."""
import pytest

from csrun_common.errors import ConfigError
from launcher.config import EMBEDDED, format_config, load_config


def env_for(tmp_path, text=None, explicit=True):
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {"HOME": str(home)}
    if text is not None:
        path = tmp_path / "site.toml"
        path.write_text(text)
        if explicit:
            env["CSRUN_CONFIG"] = str(path)
        else:
            (home / ".config" / "csrun").mkdir(parents=True)
            (home / ".config" / "csrun" / "config.toml").write_text(text)
    return env


def test_embedded_default_when_no_file(tmp_path):
    cfg = load_config(env_for(tmp_path))
    assert (cfg.nodes, cfg.tasks_per_node, cfg.cpus_per_task) == (2, 2, 1)
    assert cfg.gres_resource == "gpu:1" and cfg.gres_node == "node1"
    assert all(src == EMBEDDED for _, _, src in cfg.items())


def test_file_values_and_their_source(tmp_path):
    env = env_for(tmp_path, '[defaults]\nnodes = 7\n[container]\nmount_dirs = ["/data"]\n', explicit=False)
    cfg = load_config(env)
    assert cfg.nodes == 7 and cfg.mount_dirs == ("/data",) and cfg.tasks_per_node == 2
    src = {k: s for k, _, s in cfg.items()}
    assert src["defaults.nodes"].endswith(".config/csrun/config.toml")
    assert src["defaults.tasks_per_node"] == EMBEDDED
    text = format_config(cfg)
    assert 'defaults.nodes = 7  # ' in text and 'container.mount_dirs = ["/data"]' in text


def test_csrun_config_wins_over_home(tmp_path):
    env = env_for(tmp_path, "[defaults]\nnodes = 3\n", explicit=False)
    explicit = tmp_path / "x.toml"
    explicit.write_text("[defaults]\nnodes = 5\n")
    env["CSRUN_CONFIG"] = str(explicit)
    assert load_config(env).nodes == 5


@pytest.mark.parametrize("text,msg", [
    ("[defaults]\nnodez = 3\n", r"unknown key defaults.nodez; valid keys: defaults.nodes, defaults.tasks_per_node"),
    ("[dfaults]\nnodes = 3\n", r"unknown section \[dfaults\]; valid sections: defaults"),
    ('[defaults]\nnodes = "3"\n', r"defaults.nodes = '3': must be an integer"),
    ("[defaults]\nnodes = 0\n", r"defaults.nodes = 0: must be a positive integer"),
    ('[container]\nruntime = "docker"\n', r"container.runtime = 'docker': must be one of none, singularity"),
    ('[container]\nmount_dirs = "/data"\n', r"container.mount_dirs = '/data': must be a list of strings"),
    ('[gres]\nresource = "gpu 1"\n', r"gres.resource = 'gpu 1'"),
    ("[defaults\nnodes = 3\n", r"not valid TOML"),
])
def test_malformed_config_names_file_and_key(tmp_path, text, msg):
    env = env_for(tmp_path, text)
    with pytest.raises(ConfigError, match=msg) as info:
        load_config(env)
    assert str(tmp_path / "site.toml") in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_explicit_config_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="CSRUN_CONFIG=.*no such file"):
        load_config({"HOME": str(tmp_path), "CSRUN_CONFIG": str(tmp_path / "nope.toml")})
