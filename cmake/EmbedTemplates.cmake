# Embeds every file under templates/ into a generated C++ source as raw string literals, so the
# library carries its CUDA templates and NVRTC needs no include path on the user's machine.
function(moejit_embed_templates target template_dir)
  file(GLOB_RECURSE _tpl_files CONFIGURE_DEPENDS RELATIVE ${template_dir}
       ${template_dir}/*.cuh)
  list(SORT _tpl_files)
  set(_out ${CMAKE_CURRENT_BINARY_DIR}/generated/embedded_templates.cpp)
  set(_abs)
  foreach(f IN LISTS _tpl_files)
    list(APPEND _abs ${template_dir}/${f})
  endforeach()
  add_custom_command(
    OUTPUT ${_out}
    COMMAND ${CMAKE_COMMAND} -DTEMPLATE_DIR=${template_dir} -DOUTPUT=${_out}
            "-DFILES=${_tpl_files}" -P ${PROJECT_SOURCE_DIR}/cmake/embed_templates_script.cmake
    DEPENDS ${_abs} ${PROJECT_SOURCE_DIR}/cmake/embed_templates_script.cmake
    COMMENT "Embedding CUDA templates"
    VERBATIM)
  add_library(${target} OBJECT ${_out})
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/src)
endfunction()
