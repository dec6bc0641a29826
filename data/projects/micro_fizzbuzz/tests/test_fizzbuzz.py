import pytest

from fizzbuzz import fizzbuzz, fizzbuzz_word


def test_first_fifteen():
    assert fizzbuzz(15) == [
        "1", "2", "Fizz", "4", "Buzz", "Fizz", "7", "8", "Fizz", "Buzz",
        "11", "Fizz", "13", "14", "FizzBuzz",
    ]


def test_fizzbuzz_word():
    assert fizzbuzz_word(9) == "Fizz"
    assert fizzbuzz_word(10) == "Buzz"
    assert fizzbuzz_word(30) == "FizzBuzz"
    assert fizzbuzz_word(7) == "7"


def test_custom_rules_keep_their_order():
    rules = ((2, "Foo"), (7, "Bar"))
    assert fizzbuzz_word(14, rules) == "FooBar"
    assert fizzbuzz(4, rules) == ["1", "Foo", "3", "Foo"]
    assert fizzbuzz(2, ((1, "X"),)) == ["X", "X"]


def test_zero_limit_is_empty():
    assert fizzbuzz(0) == []
    assert fizzbuzz(1) == ["1"]


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="limit must not be negative"):
        fizzbuzz(-1)
    with pytest.raises(ValueError, match="divisors must be positive, got 0"):
        fizzbuzz(3, ((0, "Zero"),))
