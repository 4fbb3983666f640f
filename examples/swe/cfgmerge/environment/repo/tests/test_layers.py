from cfgmerge import Layers, env_overrides


def test_profile_over_defaults(defaults, profiles):
    config = Layers(defaults, profiles).resolve("prod")
    assert config["db"] == {"host": "db.internal", "pool": {"size": 50, "timeout": 30}}


def test_environment_on_top(defaults, profiles):
    config = Layers(defaults, profiles).resolve("dev", {"APP__DB__POOL__SIZE": "20", "APP__NAME": "svc", "HOME": "/"})
    assert config["db"]["pool"]["size"] == 20 and config["name"] == "svc" and config["debug"] is True


def test_env_values_are_json_when_they_parse():
    assert env_overrides({"APP__A": "[1, 2]", "APP__B": "true", "APP__C": "plain"}) == {
        "a": [1, 2], "b": True, "c": "plain"}
