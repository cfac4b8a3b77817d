def test_one_colour_map_per_quantity() -> None:
    """Every heatmap names its colour map through figures.UNIT_CMAP or SIGNED_CMAP, none by hand."""
    import re
    from pathlib import Path

    import qkv.inspect

    by_hand = []
    for module in Path(qkv.inspect.__file__).parent.glob("*.py"):
        by_hand += [f"{module.name}: {m}" for m in re.findall(r"cmap=\"[^\"]+\"", module.read_text())]
    assert by_hand == []
