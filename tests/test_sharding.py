import pytest
from jax.sharding import PartitionSpec as P
from multidevice import run_with_devices

from sweet_jax.parallel import sharding
from sweet_jax.parallel.sharding import DEFAULT_RULES, logical_to_spec


def test_logical_names_map_through_the_rules_table():
    assert logical_to_spec(("layers", "embed", "q_heads", "head_dim")) == P(None, "fsdp", "tensor", None)
    assert logical_to_spec(("batch", "seq", "act_embed")) == P(("data", "fsdp"), None, None)
    custom = (("embed", ("fsdp", "tensor")), ("vocab", None))
    assert logical_to_spec(("vocab", "embed"), custom) == P(None, ("fsdp", "tensor"))
    assert dict(DEFAULT_RULES)["mlp"] == "tensor"


@pytest.mark.slow
def test_mesh_inference_divisibility_and_axis_reuse():
    out = run_with_devices("""
        from jax.sharding import PartitionSpec as P
        from sweet_jax.parallel.sharding import logical_to_spec, make_mesh
        mesh = make_mesh({"data": 1, "fsdp": -1, "tensor": 4})
        assert dict(mesh.shape) == {"data": 1, "fsdp": 2, "tensor": 4}
        # 2 kv heads cannot be split 4 ways: replicated rather than an invalid sharding.
        assert logical_to_spec(("layers", "embed", "kv_heads", "head_dim"), mesh=mesh, shape=(2, 64, 2, 16)) \\
            == P(None, "fsdp", None, None)
        # size-1 mesh axes are dropped; a mesh axis is used once per array.
        assert logical_to_spec(("batch", "embed"), mesh=mesh, shape=(8, 64)) == P("fsdp", None)
        for bad in ({"data": -1, "fsdp": -1, "tensor": 1}, {"data": 3, "fsdp": 1, "tensor": 1}):
            try:
                make_mesh(bad)
            except ValueError as e:
                print("rejected:", e)
            else:
                raise AssertionError(bad)
        print("OK")
    """)
    assert out.count("rejected:") == 2 and "OK" in out


def test_rule_overrides_replace_entries_and_name_bad_ones():
    rules = dict(sharding.parse_rules("act_seq=tensor, vocab=none, batch=data+fsdp"))
    assert rules["act_seq"] == "tensor" and rules["vocab"] is None and rules["batch"] == ("data", "fsdp")
    assert dict(sharding.parse_rules(""))["embed"] == "fsdp"
    with pytest.raises(ValueError, match="'sequence=tensor'.*name from"):
        sharding.parse_rules("sequence=tensor")
    with pytest.raises(ValueError, match=r"\['model'\] not mesh axes"):
        sharding.parse_rules("act_seq=model")
