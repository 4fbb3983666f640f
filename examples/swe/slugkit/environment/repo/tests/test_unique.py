from slugkit import UniqueSlugger


def test_release_frees_a_slug():
    s = UniqueSlugger()
    first = s.slug("Release notes")
    s.release(first)
    assert s.slug("Release notes") == first


def test_empty_title_is_untitled():
    assert UniqueSlugger().slug("!!!") == "untitled"
