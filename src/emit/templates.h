// Templates are files under templates/, embedded into the binary at build time
// (cmake/EmbedTemplates.cmake): no search path, no dependence on the working directory.
#pragma once

#include <map>
#include <string>

namespace hectorgen::emit {

const std::map<std::string, std::string, std::less<>>& embedded_templates();

}  // namespace hectorgen::emit
