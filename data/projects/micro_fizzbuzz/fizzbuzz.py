"""FizzBuzz with configurable rules."""

DEFAULT_RULES = ((3, "Fizz"), (5, "Buzz"))


def fizzbuzz_word(number: int, rules: tuple[tuple[int, str], ...] = DEFAULT_RULES) -> str:
    """The words of every rule whose divisor divides `number`, or the number itself."""
    words = "".join(word for divisor, word in rules if number % divisor == 0)
    return words or str(number)


def fizzbuzz(limit: int, rules: tuple[tuple[int, str], ...] = DEFAULT_RULES) -> list[str]:
    """FizzBuzz for 1..limit inclusive."""
    if limit < 0:
        raise ValueError(f"limit must not be negative, got {limit}")
    for divisor, _ in rules:
        if divisor <= 0:
            raise ValueError(f"divisors must be positive, got {divisor}")
    return [fizzbuzz_word(number, rules) for number in range(1, limit + 1)]
