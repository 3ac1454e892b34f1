# server.cmake: the daemon library and executable (djinn_server, djinnd);
# the wire protocol and the client library they link: cmake/client.cmake.

# http.c/http_openai.c: the OpenAI-compatible front end; its requests enter through portals (submit.c).
add_library(djinn_server STATIC src/server/server.c src/server/worker.c src/server/metrics.c
            src/server/guard.c src/server/options.c src/server/model_info.c src/server/http.c
            src/server/http_openai.c src/server/http_view.c src/server/http_routes.c
            src/server/http_tools.c)
target_include_directories(djinn_server PUBLIC include PRIVATE src)
target_sources(djinn_server PRIVATE src/server/step_trace.c) # a STEP's points (interventions)
target_sources(djinn_server PRIVATE src/server/step_break.c src/server/handle_gone.c) # a STEP paused at a breakpoint; handles gone with their session
target_sources(djinn_server PRIVATE src/server/request.c src/server/encode.c) # typed requests (request.h) and events (event.h)
target_sources(djinn_server PRIVATE src/server/submit.c) # portals: in-process connections (the HTTP door's)
target_sources(djinn_server PRIVATE src/server/disk_tier.c) # the KV disk tier (--state-dir)
target_sources(djinn_server PRIVATE src/server/persist.c src/server/session_move.c) # session images: export, import, restart
target_sources(djinn_server PRIVATE src/server/graph_serve.c) # captured modules: weights by content, GRAPH_RUN
target_sources(djinn_server PRIVATE src/server/wrong_door.c) # HTTP sent to the binary port is answered in HTTP
# Type=notify readiness (sd_notify.c): libsystemd where found, else its datagram written by hand
target_sources(djinn_server PRIVATE src/server/sd_notify.c)
# --config FILE (INI through libinih, a Debian package: libinih-dev) and SIGHUP's reload
target_sources(djinn_server PRIVATE src/server/config_file.c src/server/reload.c)
target_sources(djinn_server PRIVATE src/server/agent_check.c) # --agent-check: HAProxy's agent protocol
target_sources(djinn_server PRIVATE src/server/access.c) # access lines (src/core/log_access.c formats them)
target_sources(djinn_server PRIVATE src/server/adapter.c) # LoRA adapters a request names (docs/lora.md)
pkg_check_modules(INIH REQUIRED IMPORTED_TARGET inih)
target_link_libraries(djinn_server PRIVATE PkgConfig::INIH)
pkg_check_modules(SYSTEMD IMPORTED_TARGET libsystemd)
if(SYSTEMD_FOUND)
  target_compile_definitions(djinn_server PRIVATE DJ_HAVE_SYSTEMD=1)
  target_link_libraries(djinn_server PRIVATE PkgConfig::SYSTEMD)
endif()
# no djinn_client: the daemon is no client of itself (the HTTP door submits in-process)
target_link_libraries(djinn_server PUBLIC djinn_engine djinn_proto PkgConfig::LIBUV PkgConfig::MHD
                      Threads::Threads)

add_executable(djinnd src/server/djinnd.c)
target_include_directories(djinnd PRIVATE src)
target_link_libraries(djinnd PRIVATE djinn_server)

# Targets made later by the top-level file (the CLI, tests, fuzzers, benches)
# get the libraries they need once they exist.
function(dj__server_link_late)
  if(TARGET djinn)
    target_link_libraries(djinn PRIVATE djinn_client djinn_server)
  endif()
  foreach(t test_protocol test_sample_schema fuzz_frame)
    if(TARGET ${t})
      target_link_libraries(${t} PRIVATE djinn_proto)
    endif()
  endforeach()
  if(TARGET fuzz_oai_tools)
    target_link_libraries(fuzz_oai_tools PRIVATE djinn_server) # http_tools.c's checks and parser
  endif()
  if(TARGET fuzz_graph_msgs)
    target_link_libraries(fuzz_graph_msgs PRIVATE djinn_server) # graph_serve.c's message decoders
  endif()
  if(TARGET test_hostile)
    target_link_libraries(test_hostile PRIVATE djinn_server) # the error-text scrubber is checked directly
  endif()
  if(TARGET test_fault)
    target_link_libraries(test_fault PRIVATE djinn_server) # the daemon runs in the test's process
  endif()
  if(TARGET test_agent_check)
    target_link_libraries(test_agent_check PRIVATE djinn_server) # the weight and reply functions
  endif()
  if(TARGET test_http_tools)
    target_link_libraries(test_http_tools PRIVATE djinn_server) # http_tools.c's functions, without a socket
  endif()
  if(TARGET test_request)
    target_link_libraries(test_request PRIVATE djinn_server) # the message table and the event encoder, no daemon
  endif()
  if(TARGET test_server_restart)
    target_link_libraries(test_server_restart PRIVATE djinn_server) # session images are read and forged (persist.h)
  endif()
  if(TARGET fuzz_session_image)
    target_link_libraries(fuzz_session_image PRIVATE djinn_server) # persist.c's image decoder
  endif()
  if(TARGET test_http_records)
    target_sources(test_http_records PRIVATE ${CMAKE_SOURCE_DIR}/tests/daemon_util.c) # its HTTP client
    target_link_libraries(test_http_records PRIVATE djinn_server) # the HTTP door runs in the test's process
  endif()
  foreach(t bench_remote bench_serve bench_agents)
    if(TARGET ${t})
      # bench/support/ is outside the bench/*.c glob: not a program of its own
      target_sources(${t} PRIVATE ${CMAKE_SOURCE_DIR}/bench/support/bench_daemon.c)
      target_include_directories(${t} PRIVATE ${CMAKE_SOURCE_DIR}/bench)
      target_link_libraries(${t} PRIVATE djinn_client djinn_server)
    endif()
  endforeach()
  if(TARGET bench_soak)
    target_sources(bench_soak PRIVATE ${CMAKE_SOURCE_DIR}/tests/daemon_util.c)
    target_include_directories(bench_soak PRIVATE ${CMAKE_SOURCE_DIR}/tests)
    target_link_libraries(bench_soak PRIVATE djinn_client)
  endif()
  if(TARGET bench_http)
    target_sources(bench_http PRIVATE ${CMAKE_SOURCE_DIR}/tests/daemon_util.c)
    target_include_directories(bench_http PRIVATE ${CMAKE_SOURCE_DIR}/tests)
    target_link_libraries(bench_http PRIVATE djinn_client)
  endif()
  if(TARGET bench_open)
    target_link_libraries(bench_open PRIVATE djinn_client)
  endif()
  foreach(t bench_fairness bench_qos)
    if(TARGET ${t})
      target_link_libraries(${t} PRIVATE djinn_client)
    endif()
  endforeach()
  file(GLOB server_tests ${CMAKE_SOURCE_DIR}/tests/test_server*.c ${CMAKE_SOURCE_DIR}/tests/test_hostile.c
       ${CMAKE_SOURCE_DIR}/tests/test_http.c ${CMAKE_SOURCE_DIR}/tests/test_http_many.c
       ${CMAKE_SOURCE_DIR}/tests/test_http_limits.c ${CMAKE_SOURCE_DIR}/tests/test_fault.c
       ${CMAKE_SOURCE_DIR}/tests/test_tenants.c ${CMAKE_SOURCE_DIR}/tests/test_http_openai.c
       ${CMAKE_SOURCE_DIR}/tests/test_http_tools.c)
  foreach(src ${server_tests})
    get_filename_component(t ${src} NAME_WE)
    if(TARGET ${t})
      target_sources(${t} PRIVATE ${CMAKE_SOURCE_DIR}/tests/daemon_util.c) # start/stop djinnd, raw frames
      target_link_libraries(${t} PRIVATE djinn_client)
      target_compile_definitions(${t} PRIVATE DJ_DJINND="$<TARGET_FILE:djinnd>")
      add_dependencies(${t} djinnd djinn)
    endif()
  endforeach()
  foreach(t test_server_agents test_server_disk test_server_restart test_http test_http_openai)
    if(TARGET ${t})
      target_sources(${t} PRIVATE ${CMAKE_SOURCE_DIR}/tests/client_util.c) # agents, reference texts
    endif()
  endforeach()
endfunction()
cmake_language(DEFER CALL dj__server_link_late)
