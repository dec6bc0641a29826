from caesar import crack, decrypt, encrypt, shift_char


def test_shift_char_wraps_and_keeps_case():
    assert shift_char("a", 1) == "b"
    assert shift_char("z", 1) == "a"
    assert shift_char("Y", 3) == "B"
    assert shift_char("a", -1) == "z"
    assert shift_char("m", 26) == "m"


def test_shift_char_leaves_other_characters():
    assert shift_char("!", 5) == "!"
    assert shift_char("é", 5) == "é"
    assert shift_char("5", 5) == "5"


def test_encrypt():
    assert encrypt("Hello, World!", 3) == "Khoor, Zruog!"
    assert encrypt("abc", 29) == "def"


def test_decrypt_inverts_encrypt():
    assert decrypt("Khoor, Zruog!", 3) == "Hello, World!"
    assert decrypt(encrypt("Attack at dawn", 11), 11) == "Attack at dawn"


def test_crack():
    assert crack(encrypt("meet me at noon", 7), "noon") == 7
    assert crack("plain text", "plain") == 0
    assert crack("xyz", "hello") is None
