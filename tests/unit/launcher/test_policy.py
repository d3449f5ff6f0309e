"""Site policies (--time, --account, --qos, --reservation, --constraint, --slurm-arg) and their
site-config keys (launcher/policy.py): pure checks, one line naming the flag or key."""
import pytest

from csrun_common.errors import ConfigError, CsrunError
from launcher.config import format_config, load_config
from launcher.policy import SitePolicy, check_slurm_arg, constraint_features, format_seconds, parse_time


@pytest.mark.parametrize("text,seconds", [
    ("90", 5400), ("5:30", 330), ("1:00:00", 3600), ("2-12", 216000), ("1-0:30", 88200),
    ("1-0:0:10", 86410), ("0:45", 45), ("UNLIMITED", None), ("infinite", None), (" 10 ", 600),
])
def test_slurm_time_formats(text, seconds):
    assert parse_time(text) == seconds


@pytest.mark.parametrize("text", ["1:2:3:4", "abc", "-5", "1h", "", "1-", "0", "0:00"])
def test_bad_time_names_the_flag_and_value(text):
    with pytest.raises(CsrunError, match=r"^--time ") as info:
        parse_time(text)
    assert repr(text) in str(info.value) and "\n" not in str(info.value)


def test_format_seconds():
    assert format_seconds(3725) == "1:02:05" and format_seconds(59) == "0:00:59"


@pytest.mark.parametrize("arg,why", [
    ("mem=0", "not a Slurm option"), ("--nodes=3", "use --total-nodes"), ("-N3", "use --total-nodes"),
    ("--qos=x", "use --qos"), ("--signal=USR1@5", "use --requeue-signal"), ("--export=NONE", "csrun sets"),
    ("--mem=0\n#SBATCH --x", "newline"), ("--", "not a Slurm option"),
])
def test_bad_slurm_arg(arg, why):
    with pytest.raises(CsrunError, match=why) as info:
        check_slurm_arg(arg)
    assert str(info.value).startswith(f"--slurm-arg {arg!r}")


def test_good_slurm_args_pass_verbatim():
    for arg in ("--mem=0", "--gpus-per-node=4", "--comment=a b", "-Q", "--hint=nomultithread"):
        assert check_slurm_arg(arg) == arg


def test_constraint_features():
    assert constraint_features("[rack1|rack2]&gpu*2") == ["rack1", "rack2", "gpu"]
    assert constraint_features("skylake") == ["skylake"]
    assert constraint_features("a,b&(c|a)") == ["a", "b", "c"]


def test_policy_options_order_and_validation():
    p = SitePolicy(partition="batch", account="ml", qos="debug", reservation="r1,r2", constraint="a&b",
                   time="1:00:00", extra_args=("--mem=0",))
    assert p.validate() is p
    assert p.options() == ["--partition=batch", "--account=ml", "--qos=debug", "--reservation=r1,r2",
                           "--constraint=a&b", "--time=1:00:00", "--mem=0"]
    assert p.time_seconds == 3600 and SitePolicy().time_seconds is None
    with pytest.raises(CsrunError, match=r"slurm\.qos 'a b': not a Slurm name"):
        SitePolicy(qos="a b").validate({"qos": "slurm.qos"})
    with pytest.raises(CsrunError, match="--account 'x,y'"):
        SitePolicy(account="x,y").validate()


def _env(tmp_path, text):
    (tmp_path / "site.toml").write_text(text)
    return {"HOME": str(tmp_path), "CSRUN_CONFIG": str(tmp_path / "site.toml")}


def test_config_keys_of_site_policies_and_requeue(tmp_path):
    cfg = load_config(_env(tmp_path, '[slurm]\nqos = "debug"\ntime = "2:00:00"\nextra_args = ["--mem=0"]\n'
                                     '[requeue]\nenabled = true\nsignal = "USR1@120"\nmax_requeues = 0\n'
                                     '[defaults]\nnode_cpus = 16\n'))
    assert (cfg.slurm.qos, cfg.slurm.time, cfg.slurm.extra_args, cfg.requeue, cfg.requeue_signal, cfg.max_requeues,
            cfg.node_cpus) == \
        ("debug", "2:00:00", ("--mem=0",), True, "USR1@120", 0, 16)
    text = format_config(cfg)
    for line in ('slurm.qos = "debug"', 'slurm.extra_args = ["--mem=0"]', "requeue.enabled = true",
                 "requeue.max_requeues = 0", "defaults.node_cpus = 16"):
        assert line in text
    embedded = load_config({"HOME": str(tmp_path / "none")})
    assert (embedded.requeue, embedded.requeue_signal, embedded.max_requeues, embedded.node_cpus) == \
        (False, "USR2@90", 3, 0)


@pytest.mark.parametrize("text,msg", [
    ('[slurm]\ntime = "soon"\n', r"slurm\.time 'soon': not a Slurm time"),
    ('[slurm]\nextra_args = ["--nodes=2"]\n', r"slurm\.extra_args '--nodes=2': csrun sets --nodes"),
    ('[requeue]\nsignal = "KILL@5"\n', r"requeue\.signal 'KILL@5': SIGKILL cannot"),
    ("[requeue]\nmax_requeues = -1\n", r"requeue\.max_requeues = -1: must be 0 or more"),
    ('[requeue]\nenabled = "yes"\n', r"requeue\.enabled = 'yes': must be true or false"),
    ("[defaults]\nnode_cpus = -2\n", r"defaults\.node_cpus = -2: must be 0 or more"),
])
def test_bad_config_values_name_file_and_key(tmp_path, text, msg):
    with pytest.raises(ConfigError, match=msg) as info:
        load_config(_env(tmp_path, text))
    assert str(tmp_path / "site.toml") in str(info.value) and "\n" not in str(info.value)
