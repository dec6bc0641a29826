"""Clamping, interpolation and remapping of numbers."""


def clamp(value: float, low: float, high: float) -> float:
    """Limits `value` to the range [low, high]."""
    if low > high:
        raise ValueError(f"low {low} is greater than high {high}")
    return max(low, min(value, high))


def lerp(start: float, end: float, t: float) -> float:
    """The point a fraction `t` of the way from `start` to `end`."""
    return start + (end - start) * t


def remap(value: float, in_low: float, in_high: float, out_low: float, out_high: float) -> float:
    """Maps `value` from [in_low, in_high] onto [out_low, out_high], clamped to the output range."""
    if in_low == in_high:
        raise ValueError("input range is empty")
    t = clamp((value - in_low) / (in_high - in_low), 0.0, 1.0)
    return lerp(out_low, out_high, t)
