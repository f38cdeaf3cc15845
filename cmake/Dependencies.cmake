# All third-party code comes from Debian packages (see tools/bootstrap.sh); nothing is downloaded.
find_package(nlohmann_json 3.10 REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(CLI11 REQUIRED)
if(HECTORGEN_BUILD_TESTS)
  find_package(Catch2 2 REQUIRED)
endif()
