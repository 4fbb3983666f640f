"""slugkit: URL slugs from titles — ASCII, lower case, one separator between words, unique within a site."""

from slugkit.normalize import fold_to_ascii, words
from slugkit.slug import slugify
from slugkit.unique import UniqueSlugger

__all__ = ["UniqueSlugger", "fold_to_ascii", "slugify", "words"]
__version__ = "1.2.0"
