# client.cmake: the wire protocol (djinn_proto) and the C client library
# (djinn_client, the file libdjinn.a), which link the core and no engine.
set(DJ_PROTO_SOURCES src/proto/protocol.c src/proto/sample_wire.c)
add_library(djinn_proto STATIC ${DJ_PROTO_SOURCES})
target_include_directories(djinn_proto PUBLIC include PRIVATE src)
target_link_libraries(djinn_proto PUBLIC djinn_core PkgConfig::MSGPACK)

# libdjinn.a: the CLI executable is `djinn` too; a library's file name is
# lib<name>.a, so the two stand side by side in the build folder.
file(GLOB DJ_CLIENT_SOURCES CONFIGURE_DEPENDS src/client/*.c)
add_library(djinn_client STATIC ${DJ_CLIENT_SOURCES})
set_target_properties(djinn_client PROPERTIES OUTPUT_NAME djinn)
target_include_directories(djinn_client PUBLIC include PRIVATE src)
target_link_libraries(djinn_client PUBLIC djinn_proto Threads::Threads)

# A program on libdjinn alone (examples/), built with the rest.
add_executable(client_generate examples/client_generate.c)
target_link_libraries(client_generate PRIVATE djinn_client)

# Everything a target links, transitively: the archives of this build's
# static libraries into <libs_var>, every other item (imported targets,
# plain library names) into <ext_var>.
function(dj__link_closure target libs_var ext_var)
  set(unvisited ${target})
  set(seen "")
  set(libs "")
  set(ext "")
  while(unvisited)
    list(POP_FRONT unvisited t)
    if(t IN_LIST seen)
      continue()
    endif()
    list(APPEND seen ${t})
    if(NOT TARGET ${t})
      list(APPEND ext ${t})
      continue()
    endif()
    get_target_property(imported ${t} IMPORTED)
    get_target_property(type ${t} TYPE)
    if(imported OR NOT type STREQUAL "STATIC_LIBRARY")
      list(APPEND ext ${t})
      continue()
    endif()
    list(APPEND libs $<TARGET_FILE:${t}>)
    get_target_property(deps ${t} INTERFACE_LINK_LIBRARIES)
    if(deps)
      foreach(d ${deps})
        string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" d "${d}")
        list(APPEND unvisited ${d})
      endforeach()
    endif()
  endwhile()
  set(${libs_var} ${libs} PARENT_SCOPE)
  set(${ext_var} ${ext} PARENT_SCOPE)
endfunction()

# The client library and all it links hold no engine, backend, model or CUDA
# symbol and need nothing but msgpack and pthread (tests/client_lib_test.sh);
# then the example against a real djinnd. After every target_link_libraries.
function(dj__client_tests)
  if(NOT DJ_TESTS)
    return()
  endif()
  dj__link_closure(djinn_client libs ext)
  add_test(NAME client_lib_test COMMAND bash ${CMAKE_SOURCE_DIR}/tests/client_lib_test.sh
           --lib ${libs} --ext ${ext})
  set_tests_properties(client_lib_test PROPERTIES TIMEOUT 120)
  if(TARGET djinnd)
    add_test(NAME client_example_test COMMAND bash ${CMAKE_SOURCE_DIR}/tests/client_example_test.sh
             $<TARGET_FILE:djinnd> $<TARGET_FILE:client_generate> ${CMAKE_SOURCE_DIR}/models)
    set_tests_properties(client_example_test PROPERTIES TIMEOUT 600)
  endif()
endfunction()
cmake_language(DEFER CALL dj__client_tests)
