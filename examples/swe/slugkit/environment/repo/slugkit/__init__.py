"""slugkit: URL slugs from titles — ASCII, lower case, one separator between words, unique within a site."""

from slugkit.filenames import safe_filename
from slugkit.normalize import fold_to_ascii, words
from slugkit.slug import slugify
from slugkit.unique import UniqueSlugger

__all__ = ["UniqueSlugger", "fold_to_ascii", "safe_filename", "slugify", "words"]
__version__ = "1.2.0"
