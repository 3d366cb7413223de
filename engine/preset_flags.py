"""A preset under the flags the user typed: the settings it overrides, its sizes under
--scale, and the rules that keep a typed flag from being replaced without a word; the
parser's hook (`overrides`) and --help's list of presets (`epilog`)."""

from engine import flags
from engine.flags import RunConfig, refuse
from presets import PRESETS, Preset


def settings_of(preset: Preset, typed: dict) -> dict:
    """The preset's overrides, and for a report's row its sizes and epochs times --scale (at
    least 1) and the share of each training set --scale keeps. A --dev_size typed
    smaller than the preset's held-out pairs shrinks them with it (unless
    --heldout_size is typed too): a small run is scored small. A typed --batch_size is
    SMART stages' batch too, unless --smart_batch_size is typed, and a typed --lr on a
    frozen encoder is the heads' (--head_lr), unless that is typed: no typed flag is lost."""
    settings = preset.overrides
    if preset.scaled is not None:
        scale = typed.get("schedule.scale", flags.ScheduleConfig.scale)
        shrunk = {k: max(1, round(v * scale)) for k, v in preset.scaled.items()}
        settings = settings | shrunk | {"data.train_share": scale}
    dev, heldout = typed.get("data.dev_size"), settings.get("data.heldout_size")
    if dev and heldout and "data.heldout_size" not in typed:
        settings = settings | {"data.heldout_size": min(heldout, dev)}
    if "optim.batch_size" in typed and "smart.smart_batch_size" not in typed:
        settings = settings | {"smart.smart_batch_size": typed["optim.batch_size"]}
    frozen = typed.get("model.freeze_encoder", settings.get("model.freeze_encoder"))
    if frozen and "optim.lr" in typed and "schedule.head_lr" not in typed:
        settings = settings | {"schedule.head_lr": typed["optim.lr"]}  # what trains: heads
    refuse(
        typed.get("smart.smart_dropout") == "shared"
        and typed.get("smart.smart_variant", settings.get("smart.smart_variant")) == "reference",
        "--smart_dropout shared: --smart_variant reference draws every pass's own masks, as "
        "SMART's code does; leave --smart_dropout out, or use --smart_variant paper",
    )
    return settings


def overrides(typed: dict) -> dict:
    """The settings of the preset the user typed (or the default one), for config.parse."""
    name = typed.get("preset", RunConfig().preset)
    if name not in PRESETS:
        raise SystemExit(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    scaled = typed.get("schedule.scale", flags.ScheduleConfig.scale) != 1
    refuse(
        scaled and PRESETS[name].scaled is None,
        f"--scale shrinks the reports' presets; {name} is not one",
    )
    return settings_of(PRESETS[name], typed)


def epilog() -> str:
    """The presets as --help lists them: each with its line and its source."""
    lines = [f"  {k:<20} {p.help} [{p.source}]" for k, p in PRESETS.items()]
    return "presets (--preset NAME --show prints what one trains):\n" + "\n".join(lines)
