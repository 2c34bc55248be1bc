#pragma once
// Everything in tests/testing: one include for integration tests.

#include "tests/testing/job_specs.h"
#include "tests/testing/net.h"
#include "tests/testing/paths.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/wait.h"
