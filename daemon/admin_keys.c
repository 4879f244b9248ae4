/* admin_keys.c - API keys in the admin API: the keys commands and the check of a bearer key. */
#include "daemon/admin_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "common/err.h"
#include "common/log.h"

#define KEY_CACHE_MS 60000

void admin_keys_changed(struct admin *a)
{
    memset(a->keys, 0, sizeof a->keys);
    int n = 0;
    if (store_key_count(a->store, &n) == 0)
        a->n_keys = n;
}

/* the required "id" of a key command; -1 when it failed the request */
static int arg_key_id(struct admin_req *r, const cJSON *args, int64_t *id)
{
    int got = admin_arg_int(r, args, "id", 1, INT64_MAX, id);
    if (got == 0)
        admin_req_fail(r, RKV_EINVAL, "%s: id is required (see rkvctl keys list)", r->cmd->name);
    return got <= 0 ? -1 : 0;
}

/* a limit argument: absent -> KEEP, "default" or null -> DEFAULT, else 0..max */
static int arg_limit(struct admin_req *r, const cJSON *args, const char *name, int64_t *out)
{
    const cJSON *v = admin_arg(args, name);
    *out = STORE_LIMIT_KEEP;
    if (!v)
        return 0;
    if (cJSON_IsNull(v) || (cJSON_IsString(v) && !strcmp(v->valuestring, "default"))) {
        *out = STORE_LIMIT_DEFAULT;
        return 1;
    }
    if (admin_arg_int(r, args, name, 0, INT32_MAX, out) < 0) {
        return -1;
    }
    return 1;
}

static const char *const limit_names[] = {"rpm", "tpm", "max_concurrent", "max_tokens",
                                          "max_prompt"};

/* the four limit arguments; *any: one was given */
static int arg_limits(struct admin_req *r, const cJSON *args, struct store_key_limits *l, int *any)
{
    int64_t *f[] = {&l->rpm, &l->tpm, &l->max_concurrent, &l->max_tokens, &l->max_prompt};
    *any = 0;
    for (int i = 0; i < 5; i++) {
        int got = arg_limit(r, args, limit_names[i], f[i]);
        if (got < 0)
            return -1;
        *any |= got;
    }
    return 0;
}

/* {"rpm": 60 | "default", ...}: a number is the key's own, "default" follows rkvd's config */
static void add_limits(cJSON *o, const struct store_key_limits *l)
{
    const int64_t f[] = {l->rpm, l->tpm, l->max_concurrent, l->max_tokens, l->max_prompt};
    cJSON *lim = cJSON_AddObjectToObject(o, "limits");
    for (int i = 0; i < 5; i++) {
        if (f[i] < 0)
            cJSON_AddStringToObject(lim, limit_names[i], "default");
        else
            cJSON_AddNumberToObject(lim, limit_names[i], (double)f[i]);
    }
}

void admin_cmd_keys_limits(struct admin *a, const cJSON *args, struct admin_req *r)
{
    int64_t id;
    if (arg_key_id(r, args, &id))
        return;
    struct store_key_limits l;
    int any;
    if (arg_limits(r, args, &l, &any))
        return;
    struct store_key k;
    int rc = store_key_set_limits(a->store, id, &l, &k);
    if (rc) {
        admin_req_fail(r, rc, "keys_limits: no live key %lld (see rkvctl keys list): %s",
                       (long long)id, rkv_strerror(rc));
        return;
    }
    if (any) {
        admin_keys_changed(a);
        log_info("admin: limits of API key %lld changed", (long long)id);
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)id);
    cJSON_AddStringToObject(o, "name", k.name);
    add_limits(o, &k.lim);
    admin_req_finish(r, 0, o, NULL);
}

void admin_cmd_keys_add(struct admin *a, const cJSON *args, struct admin_req *r)
{
    const cJSON *name = admin_arg(args, "name"), *scope = admin_arg(args, "scope");
    if (!cJSON_IsString(name) || !name->valuestring[0] || strlen(name->valuestring) > 63) {
        admin_req_fail(r, RKV_EINVAL,
                       "keys_add: name is required: 1 to 63 characters that say "
                       "whose key it is");
        return;
    }
    const char *sc = cJSON_IsString(scope) ? scope->valuestring : scope ? "" : "user";
    if (strcmp(sc, "user") && strcmp(sc, "admin")) {
        admin_req_fail(r, RKV_EINVAL,
                       "keys_add: scope must be \"user\" (the /v1 API) or \"admin\" "
                       "(also the admin API)");
        return;
    }
    struct store_key_limits l;
    int any;
    if (arg_limits(r, args, &l, &any))
        return;
    char secret[128];
    int64_t id = 0;
    struct store_key k = {.lim = {STORE_LIMIT_DEFAULT, STORE_LIMIT_DEFAULT, STORE_LIMIT_DEFAULT,
                                  STORE_LIMIT_DEFAULT, STORE_LIMIT_DEFAULT}};
    int rc = store_key_add(a->store, name->valuestring, sc, secret, sizeof secret, &id);
    if (!rc && any)
        rc = store_key_set_limits(a->store, id, &l, &k);
    if (rc) {
        OPENSSL_cleanse(secret, sizeof secret);
        admin_req_fail(r, rc, "keys_add: cannot store the key: %s", rkv_strerror(rc));
        return;
    }
    admin_keys_changed(a);
    log_info("admin: API key %lld (%s, %s) added", (long long)id, name->valuestring, sc);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)id);
    cJSON_AddStringToObject(o, "name", name->valuestring);
    cJSON_AddStringToObject(o, "scope", sc);
    cJSON_AddStringToObject(o, "secret", secret);
    OPENSSL_cleanse(secret, sizeof secret);
    add_limits(o, &k.lim);
    admin_req_finish(r, 0, o, NULL);
}

void admin_cmd_keys_list(struct admin *a, const cJSON *args, struct admin_req *r)
{
    struct store_key *k = calloc(1000, sizeof *k);
    size_t n = 0;
    int rc = k ? store_key_list(a->store, k, 1000, &n) : RKV_ENOMEM;
    if (rc) {
        free(k);
        admin_req_fail(r, rc, "keys_list: %s", rkv_strerror(rc));
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(o, "keys");
    for (size_t i = 0; i < n; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "id", (double)k[i].id);
        cJSON_AddStringToObject(e, "name", k[i].name);
        cJSON_AddStringToObject(e, "scope", k[i].scope);
        cJSON_AddStringToObject(e, "prefix", k[i].prefix);
        cJSON_AddNumberToObject(e, "created_ms", (double)k[i].created_ms);
        cJSON_AddBoolToObject(e, "revoked", k[i].revoked);
        add_limits(e, &k[i].lim);
        cJSON_AddItemToArray(arr, e);
    }
    free(k);
    admin_req_finish(r, 0, o, NULL);
}

void admin_cmd_keys_revoke(struct admin *a, const cJSON *args, struct admin_req *r)
{
    int64_t id;
    if (arg_key_id(r, args, &id))
        return;
    int rc = store_key_revoke(a->store, id);
    if (rc) {
        admin_req_fail(r, rc, "keys_revoke: no live key %lld (see rkvctl keys list): %s",
                       (long long)id, rkv_strerror(rc));
        return;
    }
    admin_keys_changed(a);
    log_info("admin: API key %lld revoked", (long long)id);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)id);
    cJSON_AddBoolToObject(o, "revoked", 1);
    admin_req_finish(r, 0, o, NULL);
}

/* 0 and *key when secret is a live key; the slow hash runs once a minute per key */
int admin_key_verify(struct admin *a, const char *secret, struct store_key *key)
{
    unsigned char h[SHA256_DIGEST_LENGTH];
    SHA256((const unsigned char *)secret, strlen(secret), h);
    uint64_t now = rkv_now_ms();
    int free_slot = 0; /* an unused entry, else the oldest */
    for (int i = 0; i < KEY_CACHE; i++) {
        struct key_cache_ent *e = &a->keys[i];
        if (e->used && now - e->at_ms < KEY_CACHE_MS && !memcmp(e->hash, h, sizeof h)) {
            key->id = e->id;
            snprintf(key->scope, sizeof key->scope, "%s", e->scope);
            key->lim = e->lim;
            return 0;
        }
        const struct key_cache_ent *f = &a->keys[free_slot];
        if (f->used && (!e->used || e->at_ms < f->at_ms))
            free_slot = i;
    }
    int rc = store_key_verify(a->store, secret, key);
    if (rc)
        return rc;
    struct key_cache_ent *e = &a->keys[free_slot];
    memcpy(e->hash, h, sizeof h);
    e->id = key->id;
    snprintf(e->scope, sizeof e->scope, "%s", key->scope);
    e->lim = key->lim;
    e->at_ms = now;
    e->used = 1;
    return 0;
}

int admin_authorize(struct admin *a, const char *secret)
{
    return admin_key_lookup(a, secret, NULL, NULL);
}

int admin_key_lookup(struct admin *a, const char *secret, int64_t *id, struct store_key_limits *lim)
{
    static const struct store_key_limits open = {STORE_LIMIT_DEFAULT, STORE_LIMIT_DEFAULT,
                                                 STORE_LIMIT_DEFAULT, STORE_LIMIT_DEFAULT,
                                                 STORE_LIMIT_DEFAULT};
    if (id)
        *id = 0;
    if (lim)
        *lim = open;
    if (!a || a->n_keys == 0)
        return 0;
    struct store_key k;
    if (!secret || admin_key_verify(a, secret, &k) != 0)
        return RKV_EAUTH;
    if (id)
        *id = k.id;
    if (lim)
        *lim = k.lim;
    return 0;
}
