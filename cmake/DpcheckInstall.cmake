# What `cmake --install` puts where: the dpcheck command with the libraries it loads from beside itself
# (the write audit, the CUDA plugin), and what a plugin's author builds against: the plugin header and
# a package config, so that `find_package(dpcheck)` gives the target dpcheck::plugin_headers.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

add_library(dpcheck_plugin_headers INTERFACE)
add_library(dpcheck::plugin_headers ALIAS dpcheck_plugin_headers)
set_target_properties(dpcheck_plugin_headers PROPERTIES EXPORT_NAME plugin_headers)
target_include_directories(dpcheck_plugin_headers INTERFACE
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

install(TARGETS dpcheck RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# dpcheck looks for these beside its own executable.
install(TARGETS dpcheck_audit LIBRARY DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TARGET dpcheck_cuda)
  install(TARGETS dpcheck_cuda LIBRARY DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

install(FILES ${PROJECT_SOURCE_DIR}/include/dpcheck/plugin.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/dpcheck)
install(TARGETS dpcheck_plugin_headers EXPORT dpcheckTargets)
set(DPCHECK_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/dpcheck)
install(EXPORT dpcheckTargets NAMESPACE dpcheck:: DESTINATION ${DPCHECK_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/dpcheckConfig.cmake.in
  ${PROJECT_BINARY_DIR}/dpcheckConfig.cmake INSTALL_DESTINATION ${DPCHECK_CMAKE_DIR} PATH_VARS CMAKE_INSTALL_BINDIR)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/dpcheckConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/dpcheckConfig.cmake ${PROJECT_BINARY_DIR}/dpcheckConfigVersion.cmake
  DESTINATION ${DPCHECK_CMAKE_DIR})
