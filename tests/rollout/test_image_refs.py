"""Image references and the image map (polar.rollout.image_refs), rules 1–2 (pure: no docker, no sockets).

1.x  image references: Docker's normalization, the canonical form, equality, refusals, a parse/canonical round trip
2.x  the image map: REF=LOCAL and @FILE items, the matching rule, the most specific entry, conflicts refused
"""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from polar.rollout.images.refs import ImageError, ImageMap, ImageRef, parse_image_map

pytestmark = pytest.mark.unit

SHA_A = "sha256:" + "a" * 64
SHA_B = "sha256:" + "b" * 64


def one_line(exc_info) -> str:
    text = str(exc_info.value)
    assert text and "\n" not in text and text.strip() == text
    return text


def refused(fn, *args, **kwargs) -> str:
    """fn's ImageError text, checked to be one line."""
    with pytest.raises(ImageError) as info:
        fn(*args, **kwargs)
    return one_line(info)


def mapping(*items: str) -> ImageMap:
    return parse_image_map(list(items), ".")

# 1.x image references

@pytest.mark.parametrize("text,canonical", [
    ("python", "docker.io/library/python:latest"),
    ("python:3.12", "docker.io/library/python:3.12"),
    ("docker.io/python:3.12", "docker.io/library/python:3.12"),
    ("docker.io/library/python:3.12", "docker.io/library/python:3.12"),
    ("index.docker.io/library/python", "docker.io/library/python:latest"),
    ("index.docker.io/python", "docker.io/library/python:latest"),
    ("library/python", "docker.io/library/python:latest"),
    ("user/repo:v1", "docker.io/user/repo:v1"),
    ("a/b/c", "docker.io/a/b/c:latest"),
    ("ghcr.io/org/img:1.0", "ghcr.io/org/img:1.0"),
    ("localhost/img", "localhost/img:latest"),
    ("localhost:5000/img:t", "localhost:5000/img:t"),
    ("localhost:5000", "docker.io/library/localhost:5000"),  # no `/`: a repository and a tag, as Docker reads it
    ("my.registry:443/a/b", "my.registry:443/a/b:latest"),
    ("Registry/img", "Registry/img:latest"),  # an upper-case first component is a registry (Docker's rule)
    ("[::1]:5000/img", "[::1]:5000/img:latest"),
    (f"python@{SHA_A}", f"docker.io/library/python@{SHA_A}"),  # a digest without a tag: no `latest`
    (f"python:3.12-slim@{SHA_A}", f"docker.io/library/python:3.12-slim@{SHA_A}"),
    ("docker.io/a.b-c__d_e/x--y", "docker.io/a.b-c__d_e/x--y:latest"),
    ("a.b/c", "a.b/c:latest"),  # a first component with a `.` is a registry
    ("img:_T.a-g", "docker.io/library/img:_T.a-g"),
])
def test_1_1_references_are_normalized_as_docker_does(text, canonical):
    ref = ImageRef.parse(text)
    assert ref.canonical() == canonical == str(ref)
    assert ImageRef.parse(canonical) == ref


def test_1_2_the_fields_keep_what_was_given():
    assert ImageRef.parse("python") == ImageRef("docker.io", "library/python", None, None)
    assert ImageRef.parse("python").tag is None and ImageRef.parse("python").effective_tag == "latest"
    ref = ImageRef.parse(f"ghcr.io/o/i:t@{SHA_A}")
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == ("ghcr.io", "o/i", "t", SHA_A)
    assert ImageRef.parse(f"i@{SHA_A}").effective_tag is None


def test_1_3_equality_and_hash_are_on_the_canonical_form():
    assert ImageRef.parse("python") == ImageRef.parse("python:latest") == ImageRef.parse("docker.io/library/python")
    assert ImageRef.parse("docker.io/python:3.12") == ImageRef.parse("python:3.12")
    assert len({ImageRef.parse("python"), ImageRef.parse("index.docker.io/library/python:latest")}) == 1
    assert ImageRef.parse("python:3.12") != ImageRef.parse("python:3.11")
    assert ImageRef.parse(f"python@{SHA_A}") != ImageRef.parse("python")
    assert ImageRef.parse("python") != "docker.io/library/python:latest"


@pytest.mark.parametrize("text,familiar", [
    ("docker.io/library/python:3.12", "python:3.12"),
    ("docker.io/user/repo", "user/repo:latest"),
    ("ghcr.io/o/i@" + SHA_A, "ghcr.io/o/i@" + SHA_A),
    ("docker.io/a.b/c", "docker.io/a.b/c:latest"),  # without docker.io/ it would read as registry a.b
])
def test_1_4_familiar_is_the_short_form(text, familiar):
    assert ImageRef.parse(text).familiar() == familiar


@pytest.mark.parametrize("text,why", [
    ("", "empty"),
    ("Python", "lower case"),
    ("docker.io/Library/python", "lower case"),
    ("python:", "tag"),
    ("python:-x", "tag"),
    ("python:" + "t" * 129, "tag"),
    ("python@sha256:abc", "digest"),
    ("python@md5:" + "a" * 32, "digest"),
    ("python@" + SHA_A.upper(), "digest"),
    ("py thon", "whitespace"),
    ("-python", "repository"),
    ("python-", "repository"),
    ("a//b", "repository"),
    ("x/", "repository"),
    ("a" * 64, "image id"),
    ("ghcr.io/" + "a" * 250, "255"),
    ("bad_host.io/x", "registry"),
    (":tag", "no repository"),
])
def test_1_5_invalid_references_are_refused_in_one_line(text, why):
    message = refused(ImageRef.parse, text)
    assert message.startswith(f"image reference {text!r}: ") and why in message
    assert message.endswith("write [REGISTRY/]REPOSITORY[:TAG][@sha256:DIGEST], e.g. python:3.12-slim")


COMPONENT = st.from_regex(r"[a-z0-9]{1,6}(?:(?:[._]|__|-{1,2})[a-z0-9]{1,6}){0,2}", fullmatch=True)
REGISTRIES = st.sampled_from([None, "docker.io", "index.docker.io", "ghcr.io", "localhost", "localhost:5000",
                              "my.reg-1.example:443", "Upper", "[fe80::1]:5000"])
TAGS = st.none() | st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}", fullmatch=True)
DIGESTS = st.none() | st.from_regex(r"sha256:[a-f0-9]{64}", fullmatch=True)


@settings(max_examples=300, deadline=None)
@given(registry=REGISTRIES, path=st.lists(COMPONENT, min_size=1, max_size=3), tag=TAGS, digest=DIGESTS)
def test_1_6_parse_and_canonical_round_trip(registry, path, tag, digest):
    assume(registry is not None or len(path) == 1 or "." not in path[0])  # else path[0] is a registry
    text = (f"{registry}/" if registry else "") + "/".join(path) + (f":{tag}" if tag else "") + \
        (f"@{digest}" if digest else "")
    ref = ImageRef.parse(text)
    again = ImageRef.parse(ref.canonical())
    assert again == ref and again.canonical() == ref.canonical()
    assert ImageRef.parse(ref.familiar()) == ref
    expected_registry = "docker.io" if registry in (None, "index.docker.io") else registry
    assert ref.registry == expected_registry
    expected_repo = "/".join(path)
    if expected_registry == "docker.io" and len(path) == 1:
        expected_repo = "library/" + expected_repo
    assert ref.repository == expected_repo
    assert (ref.tag, ref.digest) == (tag or None, digest or None)
    assert ref.canonical().endswith(":latest") == (tag is None and digest is None) or tag == "latest"


# 2.x the image map

def test_2_1_an_entry_with_a_tag_matches_that_tag_under_every_spelling_and_digest():
    image_map = mapping("python:3.12-slim=local/py312")
    for ref in ("python:3.12-slim", f"python:3.12-slim@{SHA_A}", "docker.io/library/python:3.12-slim",
                "index.docker.io/python:3.12-slim", "docker.io/python:3.12-slim"):
        assert image_map.lookup(ref) == "local/py312", ref
    for ref in ("python:3.12", "python", f"python@{SHA_A}", "ghcr.io/library/python:3.12-slim", "pypy:3.12-slim"):
        assert image_map.lookup(ref) is None, ref


def test_2_2_an_entry_without_a_tag_matches_every_tag_and_digest_of_its_repository():
    image_map = mapping("docker.io/library/ubuntu=local/ubuntu")
    for ref in ("ubuntu", "ubuntu:22.04", f"ubuntu@{SHA_A}", f"ubuntu:24.04@{SHA_B}"):
        assert image_map.lookup(ref) == "local/ubuntu"
    assert image_map.lookup("ubuntu-debootstrap") is None and image_map.lookup("other/ubuntu") is None


def test_2_3_latest_is_the_tag_of_a_reference_without_tag_or_digest():
    image_map = mapping("python:latest=local/latest")
    assert image_map.lookup("python") == "local/latest"
    assert image_map.lookup(f"python@{SHA_A}") is None  # pinned by digest alone: which tag is unknown


def test_2_4_the_most_specific_matching_entry_wins():
    image_map = mapping("python=repo", "python:3.12=tag", f"python@{SHA_A}=digest", f"python:3.12@{SHA_A}=both")
    assert image_map.lookup("python:3.11") == "repo"
    assert image_map.lookup("python:3.12") == "tag"
    assert image_map.lookup(f"python:3.12@{SHA_B}") == "tag"
    assert image_map.lookup(f"python:3.11@{SHA_A}") == "digest"
    assert image_map.lookup(f"python@{SHA_A}") == "digest"
    assert image_map.lookup(f"python:3.12@{SHA_A}") == "both"
    # the order of the items does not matter
    reversed_map = mapping(f"python:3.12@{SHA_A}=both", f"python@{SHA_A}=digest", "python:3.12=tag", "python=repo")
    for ref in ("python:3.11", "python:3.12", f"python:3.11@{SHA_A}", f"python:3.12@{SHA_A}"):
        assert reversed_map.lookup(ref) == image_map.lookup(ref)


def test_2_5_two_entries_for_the_same_ref_are_refused_unless_they_agree():
    text = refused(mapping, "python:3.12=a", "docker.io/library/python:3.12=b")
    assert text == ("--image-map 'python:3.12=a' and 'docker.io/library/python:3.12=b' map the same image to "
                    "different local images (a and b); keep one of them")
    assert "'python=a'" in refused(mapping, "python=a", "index.docker.io/python=b")
    assert len(mapping("python:3.12=a", "docker.io/python:3.12=a").entries) == 1  # a repeat is kept once
    assert len(mapping("python=a", "python:latest=b").entries) == 2  # different specificity: both kept


def test_2_6_at_file_items_skip_blank_lines_and_comments_and_read_from_cwd(tmp_path):
    (tmp_path / "maps").mkdir()
    (tmp_path / "maps" / "bases.txt").write_text(
        "# local bases\n\n  python:3.12-slim = local/py312  \nubuntu:22.04=local/ubuntu\n   # indented comment\n")
    image_map = parse_image_map(["@maps/bases.txt", "node=local/node"], tmp_path)
    assert image_map.lookup("python:3.12-slim") == "local/py312"
    assert image_map.lookup("ubuntu:22.04") == "local/ubuntu" and image_map.lookup("node:20") == "local/node"
    absolute = parse_image_map([f"@{tmp_path / 'maps' / 'bases.txt'}"], "/")
    assert [(e.ref, e.local) for e in absolute.entries] == [(e.ref, e.local) for e in image_map.entries[:2]]
    (tmp_path / "bad.txt").write_text("python=a\n\nnot a pair\n")
    assert refused(parse_image_map, ["@bad.txt"], tmp_path) == \
        "--image-map @bad.txt line 3: not REF=LOCAL; write e.g. python:3.12-slim=local/python:3.12-slim"
    (tmp_path / "nested.txt").write_text("@bad.txt\n")
    assert refused(parse_image_map, ["@nested.txt"], tmp_path).startswith(
        "--image-map @nested.txt line 1: '@bad.txt' names another file;")
    (tmp_path / "dup.txt").write_text("python=a\npython=b\n")
    assert "@dup.txt line 1 and @dup.txt line 2" in refused(parse_image_map, ["@dup.txt"], tmp_path)


@pytest.mark.parametrize("item,starts", [
    ("python", "--image-map 'python': not REF=LOCAL;"),
    ("=local", "--image-map '=local': not REF=LOCAL;"),
    ("python=", "--image-map 'python=': not REF=LOCAL;"),
    ("Python=local", "--image-map 'Python=local': image reference 'Python':"),
    ("python=Local Image", "--image-map 'python=Local Image': image reference 'Local Image':"),
    ("@", "--image-map '@' names no file;"),
    ("@missing.txt", "--image-map @missing.txt: cannot be read (No such file or directory);"),
])
def test_2_7_malformed_items_are_refused_naming_the_item(tmp_path, item, starts):
    assert refused(parse_image_map, [item], tmp_path).startswith(starts)


def test_2_8_the_empty_map_maps_nothing():
    assert not ImageMap() and ImageMap().lookup("python") is None and not parse_image_map([], ".")
    assert mapping("python=a") and mapping("python=a").lookup(ImageRef.parse("python:3")) == "a"
