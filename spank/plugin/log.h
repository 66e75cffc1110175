/* SPDX-License-Identifier: Apache-2.0 */
/* Every line the plugin logs names it, wherever Slurm sends it. */
#ifndef GPUFENCE_LOG_H
#define GPUFENCE_LOG_H

#include <slurm/spank.h>

#define gf_error(fmt, ...) slurm_error("gpufence: " fmt, ##__VA_ARGS__)
#define gf_info(fmt, ...) slurm_info("gpufence: " fmt, ##__VA_ARGS__)
#define gf_debug(fmt, ...) slurm_debug("gpufence: " fmt, ##__VA_ARGS__)

#endif
