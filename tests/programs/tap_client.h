/* tap_client.h - what every test program that taps needs: a v1 descriptor
 * with the fields a program does not vary filled in (slot "out", step and
 * CFG branch unknown, timestep NaN). The programs find probe_tap_v1 with
 * dlsym like a user's process; this header only builds descriptors. */
#ifndef PROBE_TESTS_TAP_CLIENT_H
#define PROBE_TESTS_TAP_CLIENT_H

#include <math.h>
#include <string.h>

#include "probe/tap.h"

static inline probe_tap_tensor_v1 tap_desc(const char *component, long long call, int device)
{
    probe_tap_tensor_v1 t;
    memset(&t, 0, sizeof t);
    t.struct_size = sizeof t;
    t.abi_version = PROBE_TAP_ABI_VERSION;
    t.component = component;
    t.slot = "out";
    t.call = call;
    t.step = -1;
    t.cfg_branch = -1;
    t.device = device;
    t.timestep = NAN;
    return t;
}

#endif
