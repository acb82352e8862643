// The template hash: what identifies the embedded templates' code in kernel cache keys, tuning
// rows and saved states.
#pragma once

#include <string>
#include <string_view>

namespace moejit::jit {

// Hash over every embedded file's name and code (template_code); part of every kernel cache key
// and tuning row, so editing any template's code invalidates what was built or tuned with the old
// one, while a comment's rewording leaves tuned tables and cached cubins valid.
const std::string& template_hash();

// A CUDA source's code as the template hash sees it: without comments (string and character
// literals kept whole), trailing blanks and blank lines. Conservative: a comment ending in a
// line splice is taken to end at its line.
std::string template_code(std::string_view source);

}  // namespace moejit::jit
