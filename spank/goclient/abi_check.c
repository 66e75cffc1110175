/* SPDX-License-Identifier: Apache-2.0 */
/* Fails the build when an exported Go function stops matching the type the
 * C entry expects (goclient.h). */
#include "_cgo_export.h"
#include "goclient.h"

#define SAME_TYPE(fn, type) \
	_Static_assert(__builtin_types_compatible_p(__typeof__(&fn), type), \
		       #fn " does not match " #type " in goclient.h")

SAME_TYPE(gpufence_abi_version, gpufence_abi_version_fn);
SAME_TYPE(gpufence_spool_failopen, gpufence_spool_failopen_fn);
