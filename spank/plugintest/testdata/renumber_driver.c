/* Runs gf_renumber or gf_parse_gpu_list once, for renumber_test.go.
 *   renumber_driver renumber VALUE|-unset- LIST FLAGS  -> KEEP | SET <out> | ERROR
 *   renumber_driver list S                             -> n: a,b,...
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "renumber.h"

int main(int argc, char **argv)
{
	uint32_t gpus[8];
	char out[64];
	int n;

	if (argc == 3 && !strcmp(argv[1], "list")) {
		n = gf_parse_gpu_list(argv[2], gpus, 8);
		printf("%d:", n);
		for (int i = 0; i < n; i++)
			printf("%s%u", i ? "," : " ", gpus[i]);
		printf("\n");
		return 0;
	}
	if (argc != 5 || strcmp(argv[1], "renumber"))
		return 2;
	n = gf_parse_gpu_list(argv[3], gpus, 8);
	if (n < 0)
		return 3;
	switch (gf_renumber(strcmp(argv[2], "-unset-") ? argv[2] : NULL, gpus,
			    n, atoi(argv[4]), out, sizeof(out))) {
	case GF_RENUMBER_KEEP:
		printf("KEEP\n");
		break;
	case GF_RENUMBER_SET:
		printf("SET %s\n", out);
		break;
	default:
		printf("ERROR\n");
	}
	return 0;
}
