# Embeds every file under a templates directory into the binary as a C++ table
# (name -> contents), so the generator never reads templates from disk at run time.
function(hectorgen_embed_templates out_var template_dir)
  file(GLOB_RECURSE _templates CONFIGURE_DEPENDS RELATIVE ${template_dir} ${template_dir}/*)
  list(SORT _templates)
  set(_out ${CMAKE_CURRENT_BINARY_DIR}/embedded_templates.cpp)
  set(_abs)
  foreach(_t IN LISTS _templates)
    list(APPEND _abs ${template_dir}/${_t})
  endforeach()
  add_custom_command(
    OUTPUT ${_out}
    COMMAND ${CMAKE_COMMAND} -DTEMPLATE_DIR=${template_dir} -DOUT=${_out}
            -P ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/EmbedTemplatesScript.cmake
    DEPENDS ${_abs} ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/EmbedTemplatesScript.cmake
    COMMENT "Embedding hectorgen templates"
    VERBATIM)
  set(${out_var} ${_out} PARENT_SCOPE)
endfunction()
