# install.cmake: what `cmake --install` puts where (docs/operations.md) - djinnd, djinn, libdjinn
# (shared and static, client + wire + core), its headers and djinn.pc, man pages, the systemd unit
# and an example config - and CPack's .deb of the same files.
include(GNUInstallDirs)

# libdjinn as installed: one shared object and one archive, each holding the client, the wire and the
# core (the build's own djinn_client is one archive of three; examples link that).
add_library(djinn_lib_objects OBJECT ${DJ_CLIENT_SOURCES} ${DJ_PROTO_SOURCES} ${DJ_CORE_SOURCES})
set_target_properties(djinn_lib_objects PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_include_directories(djinn_lib_objects PRIVATE include ${CMAKE_BINARY_DIR}/include src)
target_link_libraries(djinn_lib_objects PRIVATE PkgConfig::MSGPACK)
add_library(djinn_shared SHARED $<TARGET_OBJECTS:djinn_lib_objects>)
set_target_properties(djinn_shared PROPERTIES OUTPUT_NAME djinn VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}
                      LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/lib)
target_link_libraries(djinn_shared PRIVATE PkgConfig::MSGPACK Threads::Threads)
add_library(djinn_static STATIC $<TARGET_OBJECTS:djinn_lib_objects>)
set_target_properties(djinn_static PROPERTIES OUTPUT_NAME djinn ARCHIVE_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/lib)

install(TARGETS djinnd djinn RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS djinn_shared djinn_static LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
# djinn/client.h and every header it includes (tests/install_test.sh compiles against them alone)
set(DJ_PUBLIC_HEADERS include/djinn/client.h include/djinn/protocol.h include/djinn/sample_params.h
    include/djinn/status.h ${CMAKE_BINARY_DIR}/include/djinn/version.h)
install(FILES ${DJ_PUBLIC_HEADERS} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/djinn)

# djinn.pc finds its prefix from where it lies (${pcfiledir}), so one file serves any --prefix.
file(RELATIVE_PATH DJ_PC_TO_PREFIX /root/${CMAKE_INSTALL_LIBDIR}/pkgconfig /root)
string(REGEX REPLACE "/$" "" DJ_PC_TO_PREFIX "${DJ_PC_TO_PREFIX}")
configure_file(cmake/djinn.pc.in ${CMAKE_BINARY_DIR}/djinn.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/djinn.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# Man pages from --help and --version (help2man, a Debian package: scripts/setup.sh).
find_program(HELP2MAN help2man)
if(HELP2MAN)
  set(DJ_MAN8 ${CMAKE_BINARY_DIR}/man/djinnd.8)
  set(DJ_MAN1 ${CMAKE_BINARY_DIR}/man/djinn.1)
  add_custom_command(OUTPUT ${DJ_MAN8}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/man
    COMMAND ${HELP2MAN} -N -s 8 -n "Djinn's daemon: models, sessions and the GPU shared between clients"
            -o ${DJ_MAN8} $<TARGET_FILE:djinnd>
    DEPENDS djinnd VERBATIM)
  add_custom_command(OUTPUT ${DJ_MAN1}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/man
    COMMAND ${HELP2MAN} -N -s 1 -n "Djinn's command line: run models locally, or generate and look through djinnd"
            -o ${DJ_MAN1} $<TARGET_FILE:djinn>
    DEPENDS djinn VERBATIM)
  add_custom_target(djinn_man ALL DEPENDS ${DJ_MAN8} ${DJ_MAN1})
  install(FILES ${DJ_MAN8} DESTINATION ${CMAKE_INSTALL_MANDIR}/man8)
  install(FILES ${DJ_MAN1} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
else()
  message(WARNING "help2man not found: no man pages are installed (apt-get install help2man)")
endif()

# The unit and the example config: their paths are the install's own, known only when it runs
# (--prefix, or /usr for the .deb), so the unit is written then. Under the prefix /usr the config
# lies in /etc/djinn (a conffile of the .deb), elsewhere in PREFIX/etc/djinn.
install(CODE "
  if(CMAKE_INSTALL_PREFIX STREQUAL \"/usr\")
    set(dj_sysconf /etc)
  else()
    set(dj_sysconf \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_SYSCONFDIR}\")
  endif()
  set(DJ_UNIT_BINDIR \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}\")
  set(DJ_UNIT_SYSCONFDIR \"\${dj_sysconf}\")
  configure_file(\"${CMAKE_SOURCE_DIR}/deploy/systemd/djinnd.service.in\" \"${CMAKE_BINARY_DIR}/unit/djinnd.service\" @ONLY)
  file(INSTALL \"${CMAKE_BINARY_DIR}/unit/djinnd.service\" DESTINATION \"\${CMAKE_INSTALL_PREFIX}/lib/systemd/system\")
  file(INSTALL \"${CMAKE_SOURCE_DIR}/deploy/djinnd.conf\" DESTINATION \"\${dj_sysconf}/djinn\")
")
install(FILES deploy/djinnd.conf DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)

# cpack -G DEB: the same files under /usr (and /etc/djinn/djinnd.conf, a conffile).
set(CPACK_PACKAGE_NAME djinn)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR "Djinn")
set(CPACK_PACKAGE_CONTACT "Djinn maintainers <djinn@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Djinn, a tensor operating system for shared GPUs: djinnd, djinn and libdjinn")
set(CPACK_GENERATOR DEB)
set(CPACK_SET_DESTDIR ON)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION misc)
if(DJ_CUDA)
  # CUDA's libraries come from NVIDIA's packages, which dpkg-shlibdeps knows nothing of: the Debian
  # ones are listed as dpkg-shlibdeps finds them in the CPU build.
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS OFF)
  set(CPACK_DEBIAN_PACKAGE_DEPENDS "libc6 (>= 2.34), libcjson1, libgomp1, libinih1, libmicrohttpd12, libmsgpackc2, \
libpcre2-8-0, libutf8proc2, libuv1, libxxhash0")
  if(SYSTEMD_FOUND)
    string(APPEND CPACK_DEBIAN_PACKAGE_DEPENDS ", libsystemd0")
  endif()
else()
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON) # the run-time libraries, from what the binaries link
endif()
set(CPACK_DEBIAN_COMPRESSION_TYPE gzip) # fast: tests/install_test.sh builds it
file(WRITE ${CMAKE_BINARY_DIR}/deb/conffiles "/etc/djinn/djinnd.conf\n")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${CMAKE_BINARY_DIR}/deb/conffiles)
include(CPack)

# tests/install_test.sh: install into a temp prefix, build and run the example from it, the .deb.
if(DJ_TESTS AND TARGET djinnd)
  set(DJ_INSTALL_TEST_CFLAGS "")
  if(DJ_SANITIZE)
    set(DJ_INSTALL_TEST_CFLAGS "-fsanitize=address,undefined")
  endif()
  add_test(NAME install_test COMMAND bash ${CMAKE_SOURCE_DIR}/tests/install_test.sh ${CMAKE_BINARY_DIR}
           ${CMAKE_SOURCE_DIR} "${DJ_INSTALL_TEST_CFLAGS}")
  set_tests_properties(install_test PROPERTIES TIMEOUT 300)
endif()
