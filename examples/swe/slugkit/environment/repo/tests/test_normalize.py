from slugkit import fold_to_ascii, words


def test_accents_fold():
    assert fold_to_ascii("Crème brûlée à Zürich") == "Creme brulee a Zurich"


def test_letters_without_decomposition_are_spelled():
    assert fold_to_ascii("Straße Øresund") == "Strasse Oresund"


def test_words_split_on_punctuation_and_join_apostrophes():
    assert words("Don't panic -- it's 2024!") == ["dont", "panic", "its", "2024"]
